// The logistic's constants (MLAS's MlasLogisticConstants, Eigen's coefficients), shared by every path.
#pragma once

namespace specedge {

struct LogisticConstants {
  float lower, upper, a9, a7, a5, a3, a1, b10, b8, b6, b4, b2, b0;
};

constexpr LogisticConstants kLogistic{-18.0f,
                                      18.0f,
                                      4.37031012579801e-11f,
                                      1.15627324459942e-07f,
                                      6.08574864600143e-05f,
                                      8.51377133304701e-03f,
                                      2.48287947061529e-01f,
                                      6.10247389755681e-13f,
                                      5.76102136993427e-09f,
                                      6.29106785017040e-06f,
                                      1.70198817374094e-03f,
                                      1.16817656904453e-01f,
                                      9.93151921023180e-01f};

}  // namespace specedge
