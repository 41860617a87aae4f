"""Float ops that stay inside fp16 on an NPU that runs them in fp16 (QNN's HTP).

Only the MatMuls of a QNN graph are quantized; norms, residual adds, RoPE and softmax stay float,
which the HTP runs in fp16 (max 65,504). The residual stream of real models carries a few huge
channels, tens of thousands at the first token, so RMSNorm's x² overflows fp16 and the logits
come out wrong. A second limit, measured on
QNN's HTP compiler and simulator: a Div by a per-row tensor (x / m with m [1,S,1], S > 1) is
computed as x * (1/m) with subnormals flushed, so any divisor above 2^14 = 16,384 gives 0.
Everything else stays within fp16: every other float tensor is normalized, the residual itself,
or bounded by the mask (-30,000); `fp16_overflows` checks it on calibration text.

`safe_rms_norms` rewrites each RMSNorm, x / sqrt(mean(x²) + eps) * w, into the same function
computed from x scaled into [-1, 1], squared by a Mul (the HTP's Pow is not to be trusted):

    x' = x * 2^-k                  k from the calibrated range of x: max |x'| <= 2^12, exact
    x̂ = x' / m,  m = max |x'| of the row (floored at 1e-30)
    x / sqrt(mean(x²) + eps) = x̂ / sqrt(mean(x̂²) + (sqrt(eps) 2^-k / m)²)

so no intermediate exceeds 1 whatever the row holds, position 0 included, and no divisor
exceeds 2^12 on calibration text (4x inside the 2^14 limit). The power of two loses nothing but
subnormals; each row's own m keeps small rows at full precision; (sqrt(eps) 2^-k / m)² underflows
only where eps no longer changes mean(x̂²) >= 1/D. Rows stay independent of the width of the
pass. `fp16_overflows` (export/checker.py) checks the result on calibrated ranges.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

TINY = 1e-30  # floor of a row's max |x| (a row of zeros): its square is still a normal fp32 number
ROW_MAX = 2.0**12  # a norm's input is scaled by a power of two to at most this (the divisor limit is 2^14)


def prescale_exponent(calibrated_max: float, limit: float = ROW_MAX) -> int:
    """k >= 0 such that calibrated_max * 2^-k <= limit."""
    k = 0
    while calibrated_max * 2.0**-k > limit:
        k += 1
    return k


def _const(model: onnx.ModelProto, name: str, value: float) -> str:
    model.graph.initializer.append(numpy_helper.from_array(np.asarray([value], np.float32), name))
    return name


def _scalar(inits: dict[str, onnx.TensorProto], name: str) -> float | None:
    t = inits.get(name)
    if t is None or t.data_location == onnx.TensorProto.EXTERNAL:
        return None
    value = numpy_helper.to_array(t)
    return float(value.reshape(-1)[0]) if value.size == 1 else None


def find_rms_norms(model: onnx.ModelProto) -> list[dict[str, onnx.NodeProto]]:
    """Each Pow(x, 2) -> ReduceMean(-1) -> Add(eps) -> Sqrt -> Div(x, .) chain, as written by
    DecoderBuilder.rms_norm."""
    inits = {t.name: t for t in model.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def only(name: str, op: str) -> onnx.NodeProto | None:
        users = consumers.get(name, [])
        return users[0] if len(users) == 1 and users[0].op_type == op else None

    norms = []
    for pow_node in model.graph.node:
        if pow_node.op_type != "Pow" or _scalar(inits, pow_node.input[1]) != 2.0:
            continue
        x = pow_node.input[0]
        mean = only(pow_node.output[0], "ReduceMean")
        add = mean and only(mean.output[0], "Add")
        sqrt = add and only(add.output[0], "Sqrt")
        div = sqrt and only(sqrt.output[0], "Div")
        if not (mean and add and sqrt and div) or div.input[0] != x:
            continue
        eps_name = add.input[1] if add.input[0] == mean.output[0] else add.input[0]
        if _scalar(inits, eps_name) is None:
            continue
        norms.append({"pow": pow_node, "mean": mean, "add": add, "sqrt": sqrt, "div": div})
    return norms


def norm_inputs(model: onnx.ModelProto) -> list[str]:
    """The tensor each RMSNorm normalizes: whose calibrated ranges choose the prescales."""
    return [norm["pow"].input[0] for norm in find_rms_norms(model)]


def safe_rms_norms(model: onnx.ModelProto, ranges: dict[str, float]) -> int:
    """Rewrite every RMSNorm of `model` (in place) to compute from x * 2^-k / max|x * 2^-k| of its
    row, k from `ranges` (calibrated max |x| of each norm's input); returns how many were rewritten."""
    inits = {t.name: t for t in model.graph.initializer}
    norms = find_rms_norms(model)
    if not norms:
        return 0
    tiny = _const(model, "fp16safe.tiny", TINY)
    out_nodes = list(model.graph.node)
    eps_names = []
    for k, norm in enumerate(norms):
        pow_node, mean, add, div = (norm[key] for key in ("pow", "mean", "add", "div"))
        x = pow_node.input[0]
        eps_name = add.input[1] if add.input[0] == mean.output[0] else add.input[0]
        eps_names += [eps_name, pow_node.input[1]]  # replaced: the eps and the exponent of the Pow
        shift = prescale_exponent(ranges[x])
        root_eps = _const(model, f"fp16safe.{k}.sqrt_eps", float(np.sqrt(_scalar(inits, eps_name))) * 2.0**-shift)
        axes = mean.input[1] if len(mean.input) > 1 else None
        p = f"fp16safe.{k}"
        new = []
        if shift:  # by a power of two: exact
            scale = _const(model, f"{p}.prescale", 2.0**-shift)
            new.append(helper.make_node("Mul", [x, scale], [f"{p}.x"], name=f"{p}.Prescale"))
            x = f"{p}.x"
        new += [
            helper.make_node("Abs", [x], [f"{p}.abs"], name=f"{p}.Abs"),
            helper.make_node("ReduceMax", [f"{p}.abs", *([axes] if axes else [])], [f"{p}.absmax"],
                             name=f"{p}.ReduceMax", keepdims=1),
            helper.make_node("Max", [f"{p}.absmax", tiny], [f"{p}.m"], name=f"{p}.Max"),
            helper.make_node("Div", [x, f"{p}.m"], [f"{p}.xn"], name=f"{p}.Div"),
            helper.make_node("Div", [root_eps, f"{p}.m"], [f"{p}.eps_root"], name=f"{p}.DivEps"),
            helper.make_node("Mul", [f"{p}.eps_root", f"{p}.eps_root"], [f"{p}.eps"], name=f"{p}.MulEps"),
        ]
        if axes is None:  # opset < 18: axes as an attribute, carried over from the ReduceMean
            for attr in mean.attribute:
                if attr.name == "axes":
                    new[1].attribute.append(attr)
        at = out_nodes.index(pow_node)
        # x̂ * x̂, not Pow(x̂, 2): the HTP's Pow came out wrong on Qwen2.5-0.5B's first norm (x̂² off by up
        # to 4 for |x̂| <= 1, the mean of squares negative), Mul exact (both measured on the simulator)
        out_nodes[at] = helper.make_node("Mul", [f"{p}.xn", f"{p}.xn"], list(pow_node.output), name=f"{p}.Square")
        add.input[:] = [mean.output[0], f"{p}.eps"]
        div.input[0] = f"{p}.xn"
        out_nodes[at:at] = new
    del model.graph.node[:]
    model.graph.node.extend(out_nodes)
    used = {name for node in model.graph.node for name in node.input}
    orphans = set(eps_names) - used  # the old eps and exponent constants
    kept = [t for t in model.graph.initializer if t.name not in orphans]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return len(norms)
