"""`specedge profile steps`: where the time of one pass goes, for target and draft, at one row and
at the verification width, over a short and a long context.

A pass is timed as decoding runs it (median wall time of `OnnxModel.forward`, and of the session's
run inside it: the difference is Python); ONNX Runtime's profiler, in a session of its own over
the same graph, gives each node's share, grouped by what the node does: the weight MatMuls by
kind (q/k/v, o, gate/up, down, the head), attention, norms, rotary, KV-cache writes, activation
quantization, argmax, the embedding, the rest. The profiler slows the nodes it times, so its
shares are applied to the unprofiled run time. Each group's bytes are the weights it reads (and
for attention the K and V slots it reads), against this machine's read bandwidth measured in the
same run on a working set larger than the last-level cache: the floor a pass cannot beat.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from specedge.core.errors import SpecEdgeError
from specedge.runtime.engine.kv_cache import KVCache
from specedge.runtime.engine.model import OnnxModel

WEIGHT_KINDS = (("qkv_proj", "q/k/v"), ("q_proj", "q/k/v"), ("k_proj", "q/k/v"), ("v_proj", "q/k/v"),
                ("o_proj", "o"), ("gate_up_proj", "gate/up"), ("gate_proj", "gate/up"), ("up_proj", "gate/up"),
                ("down_proj", "down"), ("lm_head", "head"))
WEIGHT_MATMULS = frozenset({"MatMulInt4Rows", "MatMulNBits", "MatMulInteger", "MatMul", "MatMulIntegerToFloat",
                            "DynamicQuantizeMatMul", "Gemm"})
FUSED_ROLES = {"SimplifiedLayerNormalization": "norms", "SkipSimplifiedLayerNormalization": "norms",
               "LayerNormalization": "norms", "FusedMatMul": "attention", "GroupQueryAttention": "attention",
               "AttentionRows": "attention",
               "Softmax": "attention", "RotaryEmbedding": "rotary", "ScatterElements": "KV writes",
               "ArgMax": "argmax", "QuickGelu": "activation", "Sigmoid": "activation"}
NORM_OPS = frozenset({"Pow", "ReduceMean", "Sqrt", "Div"})
ACTIVATION_QUANT_OPS = frozenset({"Abs", "ReduceMax", "Max", "Round", "DynamicQuantizeLinear"})
ORDER = ("weights: q/k/v", "weights: o", "weights: gate/up", "weights: down", "weights: head", "attention",
         "KV writes", "norms", "rotary", "activation", "activation quantization", "embedding", "argmax", "other",
         "Python")


@dataclass
class Group:
    name: str
    ms: float
    share: float  # of the pass's wall time
    bytes: int = 0  # read by the group each pass (weights; for attention, K and V slots)
    floor_ms: float = 0.0  # bytes at the measured read bandwidth

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.ms / 1e6 if self.ms > 0 and self.bytes else 0.0


@dataclass
class StepProfile:
    model: str
    rows: int
    context: int  # cached tokens before the pass
    wall_ms: float  # median of the pass as decoding runs it
    groups: list[Group] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(g.bytes for g in self.groups)

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "groups": [{**asdict(g), "gb_per_s": g.gb_per_s} for g in self.groups]}


# -- what each node does -----------------------------------------------------------------------
def weight_kind(name: str) -> str | None:
    return next((kind for key, kind in WEIGHT_KINDS if f".{key}." in f".{name}" or name.startswith(key)), None)


def node_roles(graph_path: Path) -> tuple[dict[str, str], dict[str, int], dict[int, str]]:
    """Of an ONNX graph, read without its external weights: the role of each node by name, the
    bytes of the weights each weight role reads, and the weight kind of each MatMul output width
    (for nodes ONNX Runtime fuses under new names)."""
    try:
        import onnx
    except ImportError:
        raise SpecEdgeError("the step profiler reads the graph with the onnx package, which is not installed",
                            "pip install 'specedge[export]'") from None
    graph = onnx.load(str(graph_path), load_external_data=False).graph
    sizes = {t.name: initializer_bytes(t) for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    dims = {t.name: list(t.dims) for t in graph.initializer}
    roles: dict[str, str] = {}
    weight_bytes: dict[str, int] = defaultdict(int)
    kinds_by_n: dict[int, str] = {}
    for node in graph.node:
        role = role_of(node, sizes, producers, roles)
        roles[node.name] = role
        if role.startswith("weights: "):
            weight_bytes[role] += sum(sizes.get(x, 0) for x in node.input)
            n = next((a.i for a in node.attribute if a.name == "N"), None) or (dims.get(node.input[1]) or [0])[-1]
            kinds_by_n[int(n)] = role.removeprefix("weights: ")
    return roles, dict(weight_bytes), kinds_by_n


def initializer_bytes(tensor) -> int:  # type: ignore[no-untyped-def]  # onnx.TensorProto
    external = {e.key: e.value for e in tensor.external_data}
    if "length" in external:
        return int(external["length"])
    return len(tensor.raw_data)


def role_of(node, sizes: dict[str, int], producers: dict, roles: dict[str, str]) -> str:  # type: ignore[no-untyped-def]
    op, inputs = node.op_type, list(node.input)
    weights = [x for x in inputs if x in sizes and weight_kind(x)]
    if op in WEIGHT_MATMULS and weights:
        return f"weights: {weight_kind(weights[0])}"
    if op == "Gather" and any("embed_tokens" in x for x in inputs):
        return "embedding"
    if op == "Gather" and any(x.startswith("rope.") for x in inputs):
        return "rotary"
    if op in FUSED_ROLES and op != "Sigmoid":
        return FUSED_ROLES[op]
    fed_by = [roles.get(producers[x].name, "") for x in inputs if x in producers]
    if op in NORM_OPS or (op == "Mul" and any(x.endswith("norm.weight") for x in inputs)):
        return "norms" if op != "Div" or not any(r == "activation quantization" for r in fed_by) else \
            "activation quantization"
    if op in ACTIVATION_QUANT_OPS or (op == "Cast" and any(r == "activation quantization" for r in fed_by)):
        return "activation quantization"
    if op == "MatMul" or any(x.startswith("present_") or x == "attention_bias" for x in inputs) or \
            (op in ("Tile", "Unsqueeze", "Add") and "attention" in fed_by):
        return "attention"
    if op in ("Slice", "Concat", "Neg") and "rotary" in fed_by:
        return "rotary"
    if op in ("Sigmoid",) or (op == "Mul" and "activation" in fed_by):
        return "activation"
    return "other"


def event_role(event: dict, roles: dict[str, str], kinds_by_n: dict[int, str]) -> str:
    """The role of a profiled node: its graph node's, else (a node ONNX Runtime made by fusing
    several) by its op, a weight MatMul by its output width."""
    name = event["name"].removesuffix("_kernel_time")
    if name in roles:
        return roles[name]
    op = event.get("args", {}).get("op_name", "")
    if op in WEIGHT_MATMULS:
        shapes = event.get("args", {}).get("output_type_shape") or [{}]
        dims = next(iter(shapes[0].values()), []) if shapes and isinstance(shapes[0], dict) else []
        return f"weights: {kinds_by_n.get(dims[-1], 'other')}" if dims else "other"
    return FUSED_ROLES.get(op, "other")


# -- timing ------------------------------------------------------------------------------------
def filled_cache(model: OnnxModel, length: int) -> KVCache:
    """A cache holding `length` entries (zeros: what attention reads costs the same whatever they hold)."""
    cache = model.new_cache()
    if length:
        cache.reserve(length)
        m = model.manifest
        zeros = [] if cache.in_place else [np.zeros((1, m.num_kv_heads, length, m.head_dim), np.float32)] * m.num_layers
        cache.commit(zeros, zeros, [0] * length)
    return cache


def timed_passes(model: OnnxModel, rows: int, context: int, repeats: int) -> tuple[float, float]:
    """(median wall ms of forward, median ms of the session's run inside it)."""
    cache = filled_cache(model, context)
    runs: list[float] = []
    session = model.session
    original = session.run_with_iobinding if cache.in_place else session.run

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            runs.append(time.perf_counter() - start)

    walls = []
    name = "run_with_iobinding" if cache.in_place else "run"
    setattr(session, name, timed)  # the instance's attribute, over the class's method
    try:
        for _ in range(repeats + 1):  # the first pass warms the buffers up
            start = time.perf_counter()
            model.forward([1] * rows, cache)
            walls.append(time.perf_counter() - start)
    finally:
        delattr(session, name)
    return statistics.median(walls[1:]) * 1e3, statistics.median(runs[1:]) * 1e3


def interleaved_times(folder: Path, passes: Sequence[tuple[int, int]], rounds: int,
                      threads: int | None) -> dict[tuple[int, int], float]:
    """Median ms of a pass of each (rows, cached tokens), the passes taking turns round by round (so a
    shared machine's drift falls on all alike: their ratios are what to read)."""
    model = OnnxModel(folder, threads=threads)
    caches = {key: filled_cache(model, key[1]) for key in passes}
    times: dict[tuple[int, int], list[float]] = defaultdict(list)
    for round_ in range(rounds + 1):
        for key, cache in caches.items():
            start = time.perf_counter()
            model.forward([1] * key[0], cache)
            if round_:  # the first round warms up
                times[key].append((time.perf_counter() - start) * 1e3)
    return {key: statistics.median(t) for key, t in times.items()}


def node_shares(folder: Path, rows: int, context: int, repeats: int, threads: int | None) -> dict[str, float]:
    """Each role's share of the profiled node time of a pass (ONNX Runtime's profiler)."""
    with tempfile.TemporaryDirectory(prefix="specedge-profile-") as tmp:
        model = OnnxModel(folder, threads=threads, profile_prefix=str(Path(tmp) / "ort"))
        cache = filled_cache(model, context)
        for _ in range(repeats + 1):
            model.forward([1] * rows, cache)
        events = json.loads(Path(model.session.end_profiling()).read_text())
    roles, _, kinds_by_n = node_roles(folder / model.manifest.graph)
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    first_run_end = runs[0]["ts"] + runs[0]["dur"] if runs else 0  # the warm-up pass is left out
    totals: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] > first_run_end:
            totals[event_role(e, roles, kinds_by_n)] += e["dur"]
    node_time = sum(totals.values())
    run_time = sum(r["dur"] for r in runs[1:])
    if run_time > node_time:  # the executor's own time between nodes
        totals["other"] += run_time - node_time
        node_time = run_time
    return {role: t / node_time for role, t in totals.items()} if node_time else {}


def profile_step(folder: Path, rows: int, context: int, bandwidth: float, repeats: int = 10,
                 threads: int | None = None) -> StepProfile:
    """Where the time of one pass of `rows` rows over `context` cached tokens goes."""
    model = OnnxModel(folder, threads=threads)
    if context + rows > model.manifest.context:
        raise SpecEdgeError(f"{model.name} holds {model.manifest.context} tokens, fewer than {context} cached "
                            f"and {rows} new", "pass shorter --contexts")
    wall, run = timed_passes(model, rows, context, repeats)
    del model  # its buffers, before the profiled session of the same graph is made
    shares = node_shares(folder, rows, context, max(3, repeats // 2), threads)
    _, weight_bytes, _ = node_roles(folder / load_graph_name(folder))
    kv_bytes = kv_read_bytes(folder, context + rows)
    groups = [Group(role, run * share, run * share / wall) for role, share in shares.items()]
    groups.append(Group("Python", wall - run, (wall - run) / wall))
    for g in groups:
        g.bytes = weight_bytes.get(g.name, 0) + (kv_bytes if g.name == "attention" else 0)
        g.floor_ms = g.bytes / bandwidth / 1e6 if bandwidth else 0.0
    groups.sort(key=lambda g: ORDER.index(g.name) if g.name in ORDER else len(ORDER))
    return StepProfile(folder.name, rows, context, wall, groups)


def load_graph_name(folder: Path) -> str:
    from specedge.core.manifest import load_manifest

    return load_manifest(folder, verify=False).graph


def kv_read_bytes(folder: Path, slots: int) -> int:
    """K and V bytes attention reads over `slots` slots (exact attention reads its whole bucketed buffer)."""
    from specedge.core.manifest import load_manifest

    return load_manifest(folder, verify=False).costs.kv_slot_bytes * slots


def floor_bandwidth() -> float:
    """This machine's read bandwidth in GB/s, measured now on a working set larger than its last-level cache."""
    from specedge.device_profiles.measure import measure_bandwidth

    return measure_bandwidth(buffer_bytes=max(4 * last_level_cache(), 512 << 20), repeats=3).read_gb_per_s


def last_level_cache() -> int:
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=32 << 20)


# -- the report --------------------------------------------------------------------------------
def report(profile: StepProfile, bandwidth: float) -> Iterable[str]:
    floor = profile.bytes / bandwidth / 1e6 if bandwidth else 0.0
    yield (f"{profile.model}: {profile.rows} row{'s' if profile.rows > 1 else ''} over {profile.context} cached "
           f"tokens: {profile.wall_ms:.1f} ms ({profile.bytes / 1e6:.0f} MB read: floor {floor:.1f} ms at "
           f"{bandwidth:.1f} GB/s, {profile.wall_ms / floor:.2f}x it)" if floor else "")
    yield f"  {'':<26}{'ms':>8}{'%':>7}{'MB':>9}{'GB/s':>8}{'floor ms':>10}"
    for g in profile.groups:
        mb = f"{g.bytes / 1e6:9.1f}" if g.bytes else f"{'':>9}"
        rate = f"{g.gb_per_s:8.1f}" if g.bytes else f"{'':>8}"
        floor_ms = f"{g.floor_ms:10.2f}" if g.bytes else f"{'':>10}"
        yield f"  {g.name:<26}{g.ms:8.2f}{100 * g.share:7.1f}{mb}{rate}{floor_ms}"


def profile_steps(models: Sequence[tuple[str, Path]], widths: Mapping[str, Sequence[int]], contexts: Sequence[int],
                  repeats: int, threads: int | None) -> tuple[list[StepProfile], float, dict[Path, dict]]:
    """Each (role, artifact)'s passes at its role's widths over each context, the read bandwidth
    measured first, and each artifact's passes timed interleaved (their ratios)."""
    bandwidth = floor_bandwidth()
    out, ratios = [], {}
    for role, folder in models:
        passes = [(rows, context) for context in contexts for rows in widths[role]]
        ratios[folder] = interleaved_times(folder, passes, max(repeats, 10), threads)
        for rows, context in passes:
            out.append(profile_step(folder, rows, context, bandwidth, repeats, threads))
    return out, bandwidth, ratios


def ratio_lines(folder: Path, times: Mapping[tuple[int, int], float]) -> Iterable[str]:
    """The interleaved passes against a 1-row pass over the shortest context."""
    base_key = min(times, key=lambda k: (k[0], k[1]))
    base = times[base_key]
    yield (f"{folder.name}, passes timed in turn (medians; against {base_key[0]} row over {base_key[1]} cached "
           f"tokens, {base:.1f} ms):")
    for (rows, context), ms in sorted(times.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        yield f"  {rows} row{'s' if rows > 1 else ''} over {context:>5} cached tokens: {ms:6.1f} ms  {ms / base:.2f}x"
