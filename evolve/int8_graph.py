"""The torch side of the int8 query encoder (evolve/int8_encoder.py): MiniLM's transformer with its
encoder Linears run as onnxruntime's `DynamicQuantizeMatMul` once exported, with SmoothQuant scales.

Two graphs. For a plain BERT model (MiniLM is one) `QueryGraph`: one query per run, written out so that
the exported graph holds little besides the products. A batch of one text needs no attention mask and no
padding, so no mask arithmetic and no shape bookkeeping (the exporter otherwise turns every
`view(size()[:-1] + ...)` into Shape -> Gather -> Unsqueeze -> Concat -> Reshape): 129 nodes instead of
275 on MiniLM-L6, ~0.25 ms less per query (measured in benchmarks/retrieval.py). Other encoders get a
quantised copy of the model itself, exported through its own forward (`quantised_model`).

Imported only to build a graph (torch is never needed to encode). Each `Int8Linear` computes, in torch,
the same function its exported node does up to the activation rounding (the tracer runs it once), so the
modules are also a readable reference of what the graphs compute.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import symbolic_helper

from evolve.int8_encoder import ALPHA, Int8Unavailable

CALIBRATION = [  # varied, query- and fact-like; none taken from a benchmark or test set
    "How do I reset my password on the staging server?", "The deploy failed because the migration timed out.",
    "Write a Python function that parses ISO dates and returns UTC timestamps.",
    "She prefers short answers without bullet points.", "What's the weather like in Lisbon next week?",
    "Refactor the billing module to use the new payments API.", "git rebase -i HEAD~3 then force push",
    "The meeting moved to Thursday at 3pm because the client asked.",
    "SELECT id, name FROM users WHERE created_at > now() - interval '7 days';",
    "Translate this paragraph into German, keep the tone formal.",
    "Our CI pipeline runs lint, unit tests and an integration suite on every pull request.",
    "I live near the river and commute by bike.", "Summarise the incident report and list the action items.",
    "Install the package with pip and pin the version in requirements.txt", "Error: connection refused on port 5432",
    "Remember that I am vegetarian when suggesting recipes.", "Revenue grew by twelve percent on last year.",
    "Which tool should I use to profile memory leaks in Node?", "kubectl get pods -n production | grep CrashLoop",
    "My manager wants the design doc reviewed before Friday.", "Explain the difference between a process and a thread.",
    "The cat knocked the glass off the table again.", "hello", "thanks!", "ok", "Ünïcödé ✓ 日本語 naïve café",
    " ".join(["a long text about configuration files and their many options"] * 20),
]
TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class DynQuantMatMul(torch.autograd.Function):
    """y = x @ (Bq * scale) + bias in torch; onnxruntime's com.microsoft DynamicQuantizeMatMul in ONNX
    (x quantised to uint8 per call, an integer GEMM, rescaled by scale per output column)."""

    @staticmethod
    def forward(ctx, x, bq, scale, zero, bias):  # noqa: ARG004 - same arguments as the symbolic
        return x @ (bq.float() * scale) + bias

    @staticmethod
    def symbolic(g, x, bq, scale, zero, bias):
        y = g.op("com.microsoft::DynamicQuantizeMatMul", x, bq, scale, zero, bias)
        sizes, out = symbolic_helper._get_tensor_sizes(x), symbolic_helper._get_tensor_sizes(bias)
        if sizes is not None and out is not None:  # typed output: the exporter's shape inference needs it
            y.setType(x.type().with_sizes([*sizes[:-1], out[0]]))
        return y


class Int8Linear(torch.nn.Module):
    """A Linear as (x / s) then an int8 product: weights (K, N) int8, one scale per output channel
    (symmetric, zero point 0); s (K,) the SmoothQuant migration scale per input channel."""

    def __init__(self, linear: torch.nn.Linear, input_max: torch.Tensor, alpha: float = ALPHA):
        super().__init__()
        w = linear.weight.detach().float()  # (N, K)
        s = input_max.clamp(min=1e-5) ** alpha / w.abs().amax(dim=0).clamp(min=1e-5) ** (1 - alpha)
        w = w * s[None, :]
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # (N,)
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        n = q.shape[0]
        self.register_buffer("inv_s", (1.0 / s).float())  # (K,)
        self.register_buffer("bq", q.T.contiguous())  # (K, N) int8
        self.register_buffer("scale", scale.float())  # (N,)
        self.register_buffer("zero", torch.zeros(n, dtype=torch.int8))  # (N,)
        bias = linear.bias.detach().float() if linear.bias is not None else torch.zeros(n)
        self.register_buffer("bias", bias.clone())  # (N,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x if self.inv_s is None else x * self.inv_s
        return DynQuantMatMul.apply(x, self.bq, self.scale, self.zero, self.bias)

    def scale_outputs(self, c: torch.Tensor | float) -> None:
        """Multiply output column j by c (or c[j]): exact, the product is rescaled per column anyway."""
        self.scale.mul_(c)
        self.bias.mul_(c)

    def take_input_scale(self) -> torch.Tensor:
        """Hand over this product's 1/s (for its producer to apply) and stop applying it here: one Mul less."""
        inv_s, self.inv_s = self.inv_s, None
        return inv_s


class Int8Embedding(torch.nn.Module):
    """An Embedding kept as int8 rows with one float scale per row: gathered, then rescaled."""

    def __init__(self, embedding: torch.nn.Embedding):
        super().__init__()
        w = embedding.weight.detach().float()  # (V, D)
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        self.register_buffer("q", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))  # (V, D)
        self.register_buffer("scale", scale[:, None].float().contiguous())  # (V, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.q[ids].float() * self.scale[ids]


def quantised_model(st: Any) -> torch.nn.Module:
    """A copy of `st`'s BERT-like transformer whose encoder Linears are `Int8Linear`s (scales from
    CALIBRATION) and whose word embeddings are an `Int8Embedding`. Refuses models of another shape."""
    bert = copy.deepcopy(st[0].auto_model).eval()
    emb = getattr(getattr(bert, "embeddings", None), "word_embeddings", None)
    if getattr(bert, "encoder", None) is None or not isinstance(emb, torch.nn.Embedding):
        raise Int8Unavailable(f"{type(bert).__name__} has no encoder / word_embeddings to quantise")
    amax = input_ranges(st, bert, CALIBRATION)
    if not amax:
        raise Int8Unavailable(f"{type(bert).__name__}'s encoder has no Linear layers")
    for name, parent in list(bert.encoder.named_modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                full = f"{name}.{child_name}" if name else child_name
                setattr(parent, child_name, Int8Linear(child, amax[full]))
    bert.embeddings.word_embeddings = Int8Embedding(emb)
    return bert


class _Layer(torch.nn.Module):
    """One BERT encoder layer on a (T, D) batch of one text: Q, K and V as one int8 product (one
    activation scale and one quantisation of the input instead of three), 1/sqrt(head dim) folded into
    Q's columns and the output product's SmoothQuant 1/s into V's (context columns are V's columns
    mixed per row), so neither costs a node."""

    def __init__(self, layer: torch.nn.Module, amax: dict[str, torch.Tensor], prefix: str, heads: int):
        super().__init__()
        att = layer.attention
        q, k, v = att.self.query, att.self.key, att.self.value
        fused = torch.nn.Linear(q.in_features, 3 * q.out_features)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
            fused.bias.copy_(torch.cat([q.bias, k.bias, v.bias]))
        xmax = torch.stack([amax[f"{prefix}.attention.self.{n}"] for n in ("query", "key", "value")]).amax(dim=0)
        self.heads, self.width = heads, q.out_features
        self.head_dim = self.width // heads
        self.qkv = Int8Linear(fused, xmax)
        self.out = Int8Linear(att.output.dense, amax[f"{prefix}.attention.output.dense"])
        with torch.no_grad():
            cols = torch.ones(3 * self.width)
            cols[: self.width] = self.head_dim ** -0.5
            cols[2 * self.width:] = self.out.take_input_scale()
            self.qkv.scale_outputs(cols)
        self.ln1 = copy.deepcopy(att.output.LayerNorm)
        self.up = Int8Linear(layer.intermediate.dense, amax[f"{prefix}.intermediate.dense"])
        self.down = Int8Linear(layer.output.dense, amax[f"{prefix}.output.dense"])
        self.ln2 = copy.deepcopy(layer.output.LayerNorm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.heads
        heads = self.qkv(x).reshape(-1, 3 * h, self.head_dim).transpose(0, 1)  # (3H, T, d)
        q, k, v = heads.split(h)
        ctx = (torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v).transpose(0, 1).reshape(-1, self.width)
        x = self.ln1(self.out(ctx) + x)
        return self.ln2(self.down(torch.nn.functional.gelu(self.up(x))) + x)


class QueryGraph(torch.nn.Module):
    """A plain BERT sentence encoder (Transformer -> mean pooling -> normalise) for one text: input_ids
    (1, T) -> its unit vector (1, D). Token type 0 throughout (one text), folded into the position table.
    Refuses (`Int8Unavailable`) anything but BERT with absolute positions and exact GELU."""

    def __init__(self, st: Any):
        super().__init__()
        bert = st[0].auto_model
        cfg = bert.config
        plain = (cfg.model_type == "bert" and getattr(cfg, "position_embedding_type", "absolute") == "absolute"
                 and cfg.hidden_act == "gelu" and not cfg.is_decoder)
        if not plain:
            raise Int8Unavailable(f"{cfg.model_type} ({cfg.hidden_act}) is not a plain BERT encoder")
        amax = input_ranges(st, bert, CALIBRATION)
        emb = bert.embeddings
        self.word = Int8Embedding(emb.word_embeddings)
        with torch.no_grad():
            pos = emb.position_embeddings.weight + emb.token_type_embeddings.weight[0]
        self.register_buffer("pos", pos.detach().float().clone())  # (max positions, D)
        self.ln = copy.deepcopy(emb.LayerNorm)
        self.layers = torch.nn.ModuleList(
            _Layer(layer, amax, f"layer.{i}", cfg.num_attention_heads) for i, layer in enumerate(bert.encoder.layer))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.reshape(-1)
        x = self.ln(self.word(ids) + self.pos[: ids.shape[0]])
        for layer in self.layers:
            x = layer(x)
        pooled = x.mean(dim=0, keepdim=True)
        return pooled / pooled.norm(dim=1, keepdim=True).clamp(min=1e-12)


def export_query_graph(st: Any, graph: QueryGraph, path: Path) -> None:
    """Export `graph` to `path`: input_ids (1, tokens) -> SENTENCE_OUTPUT (1, D); the batch stays 1."""
    from evolve.onnx_encoder import OPSET, SENTENCE_OUTPUT, _without_onnx_package

    ids = st.preprocess(["a query to trace"])["input_ids"]
    with torch.no_grad(), _without_onnx_package(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on frozen checks; the export is checked after
        torch.onnx.export(graph.eval(), (ids,), str(path), dynamo=False, input_names=["input_ids"],
                          output_names=[SENTENCE_OUTPUT], dynamic_axes={"input_ids": {1: "tokens"}},
                          opset_version=OPSET, custom_opsets={"com.microsoft": 1})


def input_ranges(st: Any, bert: torch.nn.Module, texts: list[str]) -> dict[str, torch.Tensor]:
    """Per Linear of `bert.encoder` (by its name there): max |input| per input channel over `texts`, (K,)."""
    amax: dict[str, torch.Tensor] = {}

    def hook(name: str):
        def record(_mod, args, _out):
            a = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(dim=0)
            amax[name] = torch.maximum(amax[name], a) if name in amax else a
        return record

    hooks = [m.register_forward_hook(hook(n)) for n, m in bert.encoder.named_modules()
             if isinstance(m, torch.nn.Linear)]
    try:
        with torch.no_grad():
            for text in texts:  # one at a time: padded rows would add ranges no real input has
                feats = st.preprocess([text])
                bert(**{k: v for k, v in feats.items() if k in TEXT_INPUTS})
    finally:
        for h in hooks:
            h.remove()
    return amax
