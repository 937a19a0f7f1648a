"""The models of ``benchmarks/models.py``: plain-PyTorch ones kept here (the suite runs
with nothing but torch), and ``transformers`` / ``torchvision`` ones where installed.

Each entry builds ``(model, make_inputs, loss_fn)`` for a device and a size class
(``"small"``: a 2-core CPU; ``"large"``: a GPU).  ``make_inputs(seed)`` returns fresh
random inputs; ``loss_fn(output)`` turns the model's output into a scalar for the
training step.
"""
from __future__ import annotations

import importlib.util
import inspect
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype) * self.weight


def _rotate(x, cos, sin):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)


class LlamaBlock(nn.Module):
    """RMSNorm, rotary embeddings, grouped-query attention through SDPA, SwiGLU."""

    def __init__(self, dim: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        hidden = int(8 * dim / 3) // 32 * 32
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        y = self.norm1(x)
        q = self.wq(y).view(b, t, self.heads, self.head_dim)
        k = self.wk(y).view(b, t, self.kv_heads, self.head_dim)
        v = self.wv(y).view(b, t, self.kv_heads, self.head_dim)
        q, k = _rotate(q, cos, sin).transpose(1, 2), _rotate(k, cos, sin).transpose(1, 2)
        v = v.transpose(1, 2)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.wo(a)
        y = self.norm2(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class Llama(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, kv_heads: int, seq: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(LlamaBlock(dim, heads, kv_heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        half = dim // heads // 2
        inv = 1.0 / (10000 ** (torch.arange(half).float() / half))
        angles = torch.outer(torch.arange(seq).float(), inv)
        self.register_buffer("cos", angles.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", angles.sin()[None, :, None, :], persistent=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class GPTBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """Layer norm, tanh-GELU MLP, causal SDPA, cross-entropy."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(GPTBlock(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class ConvNet(nn.Module):
    """Five conv / batch-norm / ReLU blocks, two max-pools, a residual add, a linear head."""

    def __init__(self, width: int = 32, classes: int = 10):
        super().__init__()

        def block(ci, co):
            return nn.Sequential(nn.Conv2d(ci, co, 3, padding=1, bias=False), nn.BatchNorm2d(co), nn.ReLU())
        w = width
        self.stem, self.b1 = block(3, w), block(w, 2 * w)
        self.b2, self.b3 = block(2 * w, 2 * w), block(2 * w, 4 * w)
        self.b4 = block(4 * w, 4 * w)
        self.head = nn.Linear(4 * w, classes)

    def forward(self, x):
        x = F.max_pool2d(self.b1(self.stem(x)), 2)
        x = x + self.b2(x)
        x = F.max_pool2d(self.b3(x), 2)
        x = x + self.b4(x)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, layers: int, classes: int = 10):
        super().__init__()
        dims = [dim] + [hidden] * layers
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        for layer in self.layers:
            x = F.gelu(layer(x))
        return self.head(x)


@dataclass
class SuiteModel:
    """A model of the suite, built for one device and size class."""

    name: str
    build: Callable[[str, str], tuple]   # (device, size) -> (model, make_inputs, loss_fn)
    needs: str = ""                      # the optional package it needs, if any
    suite: str = "core"                  # "vision": the torchvision families (``models.py --suite vision``)
    training: bool = True                # False: inference only (a decode step)


def _tokens(vocab, batch, seq, device):
    def make(seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.randint(0, vocab, (batch, seq), generator=g).to(device),
                torch.randint(0, vocab, (batch, seq), generator=g).to(device))
    return make


def _images(batch, size, device, channels=3):
    def make(seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(batch, channels, size, size, generator=g).to(device),)
    return make


def _identity_loss(out):
    return out


def _mean_loss(out):
    out = out.logits if hasattr(out, "logits") else out
    out = out.last_hidden_state if hasattr(out, "last_hidden_state") else out
    return out.float().pow(2).mean()


def _llama(device, size):
    small = size == "small"
    vocab, dim, layers, heads, kv, seq, batch = (1000, 192, 3, 6, 2, 128, 8) if small else \
        (32000, 1024, 4, 16, 4, 512, 8)
    return Llama(vocab, dim, layers, heads, kv, seq), _tokens(vocab, batch, seq, device), _identity_loss


def _gpt(device, size):
    small = size == "small"
    vocab, dim, layers, heads, seq, batch = (1000, 192, 3, 6, 128, 8) if small else (32000, 768, 4, 12, 512, 8)
    return GPT(vocab, dim, layers, heads, seq), _tokens(vocab, batch, seq, device), _identity_loss


def _convnet(device, size):
    batch, image, width = (16, 64, 32) if size == "small" else (64, 128, 64)
    return ConvNet(width), _images(batch, image, device), _mean_loss


def _mlp(device, size):
    batch, dim, hidden = (64, 256, 512) if size == "small" else (512, 1024, 4096)

    def make(seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(batch, dim, generator=g).to(device),)
    return MLP(dim, hidden, 3), make, _mean_loss


def _token_ids(vocab, size, device):
    """Token ids only (the models take no targets): batch 4 x 128 small, 8 x 256 large."""
    batch, seq = (4, 128) if size == "small" else (8, 256)
    make = _tokens(vocab, batch, seq, device)

    def inputs(seed):
        tokens, _ = make(seed)
        return (tokens,)
    return inputs


def _hf_gpt2(device, size):
    from transformers import GPT2Config, GPT2LMHeadModel
    small = size == "small"
    config = GPT2Config(n_layer=2 if small else 4, n_embd=256 if small else 512, n_head=4 if small else 8,
                        vocab_size=1000 if small else 50257, n_positions=1024)
    return GPT2LMHeadModel(config), _token_ids(config.vocab_size, size, device), _mean_loss


def _hf_bert(device, size):
    from transformers import BertConfig, BertModel
    small = size == "small"
    config = BertConfig(num_hidden_layers=2 if small else 4, hidden_size=256 if small else 512,
                        num_attention_heads=4 if small else 8, intermediate_size=1024 if small else 2048,
                        vocab_size=1000 if small else 30522)
    return BertModel(config, add_pooling_layer=False), _token_ids(config.vocab_size, size, device), _mean_loss


def _hf_llama(device, size):
    """HF ``LlamaForCausalLM`` with grouped KV heads (8 query heads, 2 KV heads), SDPA attention."""
    from transformers import LlamaForCausalLM
    config = _llama_config(size, layers=2 if size == "small" else 4)
    return LlamaForCausalLM(config), _token_ids(config.vocab_size, size, device), _mean_loss


def _hf_qwen2(device, size):
    """HF ``Qwen2ForCausalLM`` as issue 39 measured it: 8 layers, 1024 wide, grouped KV heads
    (16 query heads, 2 KV heads: Qwen2's ratio), q/k/v projections with bias, SDPA attention."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    small = size == "small"
    config = Qwen2Config(num_hidden_layers=2 if small else 8, hidden_size=256 if small else 1024,
                         num_attention_heads=8 if small else 16, num_key_value_heads=2,
                         intermediate_size=704 if small else 2816, vocab_size=1000 if small else 32000,
                         max_position_embeddings=1024, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(config), _token_ids(config.vocab_size, size, device), _mean_loss


def _llama_config(size, layers):
    """The HF Llama config of the suite: grouped KV heads, SDPA attention, ``layers`` layers."""
    from transformers import LlamaConfig
    small = size == "small"
    config = LlamaConfig(num_hidden_layers=layers, hidden_size=256 if small else 1024,
                         num_attention_heads=8 if small else 16, num_key_value_heads=2 if small else 4,
                         intermediate_size=704 if small else 2816, vocab_size=1000 if small else 32000,
                         max_position_embeddings=1024)
    config._attn_implementation = "sdpa"
    return config


class _EncoderDecoder(nn.Module):
    """``forward(input_ids, decoder_input_ids) -> last hidden state`` of an HF encoder-decoder."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, decoder_input_ids):
        return self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).last_hidden_state


def _hf_t5(device, size):
    """HF ``T5Model`` (relative position buckets, T5 layer norm, ReLU MLP, no dropout): encoder
    over 128 tokens, decoder over 32 (small)."""
    from transformers import T5Config, T5Model
    small = size == "small"
    config = T5Config(num_layers=2 if small else 4, num_decoder_layers=2 if small else 4,
                      d_model=256 if small else 512, d_kv=32 if small else 64, num_heads=8,
                      d_ff=1024 if small else 2048, vocab_size=1000 if small else 32128,
                      dropout_rate=0.0)  # training compared with eager: no random dropout masks
    config._attn_implementation = "sdpa"
    batch, seq, target = (4, 128, 32) if small else (8, 256, 64)

    def make(seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.randint(0, config.vocab_size, (batch, seq), generator=g).to(device),
                torch.randint(0, config.vocab_size, (batch, target), generator=g).to(device))
    return _EncoderDecoder(T5Model(config)), make, _mean_loss


def _decode_inputs(vocab, pos, device):
    """One decode step's inputs: a ``[1, 1]`` token and its position ``[1]`` (written to the
    KV cache at ``pos``: every timed call writes the same slots, as a step of a generation would)."""
    def make(seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.randint(0, vocab, (1, 1), generator=g).to(device), torch.tensor([pos], device=device))
    return make


def _prefill(step_model: nn.Module, vocab: int, prompt: int, device) -> None:
    """Fill the first ``prompt`` cache slots eagerly (random tokens), one step at a time."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for i in range(prompt):
            step_model(torch.randint(0, vocab, (1, 1), generator=g).to(device), torch.tensor([i], device=device))


def _decode(device, size):
    """One decode step of a Llama-style model (benchmarks/decode.py's ``HandLlama``): batch 1, one
    token, grouped KV heads (8 query, 2 KV), the static KV cache as buffers written with
    ``index_copy_``, masked SDPA over the whole cache; 100 positions prefilled."""
    from decode import HandLlama
    small = size == "small"
    layers, dim, heads, kv, hidden, vocab, max_seq = (4, 256, 8, 2, 704, 1000, 256) if small else \
        (12, 1024, 16, 4, 2816, 32000, 1024)
    model = HandLlama(layers, dim, heads, kv, hidden, vocab, max_seq, dtype=torch.float32).to(device)
    _prefill(model, vocab, 100, device)
    return model, _decode_inputs(vocab, 100, device), _identity_loss


class _HFDecodeStep(nn.Module):
    """``forward(token [1, 1], pos [1]) -> logits``: one step of an HF causal LM with its static cache."""

    def __init__(self, model: nn.Module, cache):
        super().__init__()
        self.model, self.cache = model, cache
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.with_position = "cache_position" in params

    def _apply(self, fn, recurse=True):
        """``.to(torch.bfloat16)`` / ``.to(device)`` reach the cache's tensors too (they are not
        buffers of the module: the variant's dtype would leave them float32)."""
        super()._apply(fn, recurse)
        for holder in getattr(self.cache, "layers", None) or [self.cache]:
            for name in ("keys", "values", "key_cache", "value_cache"):
                value = getattr(holder, name, None)
                if isinstance(value, torch.Tensor):
                    setattr(holder, name, fn(value))
                elif isinstance(value, list):
                    setattr(holder, name, [fn(v) if isinstance(v, torch.Tensor) else v for v in value])
        return self

    def forward(self, token, pos):
        # transformers 5.x's static layers write at their own counter (``cumulative_length``, one
        # step further at every call) and read no ``cache_position``: set it to the step's position,
        # so every call writes slot ``pos`` (after 156 timed calls the counter ran past the cache)
        for holder in getattr(self.cache, "layers", None) or []:
            length = getattr(holder, "cumulative_length", None)
            if isinstance(length, torch.Tensor):
                length.copy_(pos.reshape(()))
        kwargs = {self.cache_arg: self.cache, "position_ids": pos.view(1, 1)}
        if self.with_position:
            kwargs["cache_position"] = pos
        return self.model(input_ids=token, use_cache=True, **kwargs).logits


def _hf_llama_decode(device, size):
    """One decode step of HF ``LlamaForCausalLM`` (grouped KV heads) with its ``StaticCache``;
    100 positions prefilled eagerly (the cache initializes itself on its first write)."""
    from transformers import LlamaForCausalLM, StaticCache
    small = size == "small"
    config = _llama_config(size, layers=4 if small else 8)
    max_seq = 256 if small else 1024
    model = LlamaForCausalLM(config).to(device).eval()
    wanted = inspect.signature(StaticCache.__init__).parameters
    kwargs = {"config": config, "max_cache_len": max_seq}
    for name, value in (("max_batch_size", 1), ("batch_size", 1), ("device", device), ("dtype", torch.float32)):
        if name in wanted:
            kwargs[name] = value
    step = _HFDecodeStep(model, StaticCache(**kwargs))
    _prefill(step, config.vocab_size, 100, device)
    return step, _decode_inputs(config.vocab_size, 100, device), _identity_loss


def import_torchvision():
    """``import torchvision``, or where its compiled ops do not load against this torch (a
    torchvision wheel built for another torch: ``operator torchvision::nms does not exist``
    while ``torchvision._meta_registrations`` registers fake kernels for them), the import
    again with that module replaced by an empty one.  The model constructors need none of
    the compiled ops (only the detection ops nms / roi_align do, and they stay unavailable);
    a note on stderr says the shim is in use."""
    try:
        import torchvision
        return torchvision
    except RuntimeError as error:
        if "torchvision::" not in str(error):
            raise
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]  # the half-imported package of the failed attempt
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision
        print(f"note: torchvision {torchvision.__version__}'s compiled ops do not load against torch "
              f"{torch.__version__} ({error}); imported without its meta registrations "
              "(the model constructors work, detection ops do not)", file=sys.stderr, flush=True)
        return torchvision


def _torchvision(constructor: str, gpu_batch: int = 32, cpu_batch: int = 1, image: int = 224, **kwargs):
    """A torchvision model from its constructor (random weights), at the sizes a user runs it:
    ``gpu_batch`` images of ``image`` x ``image`` on a GPU, ``cpu_batch`` on the CPU."""
    def build(device, size):
        import_torchvision()
        import torchvision.models as models
        import torchvision.models.segmentation as segmentation
        make = getattr(models, constructor, None) or getattr(segmentation, constructor)
        batch = cpu_batch if size == "small" else gpu_batch
        return make(weights=None, **kwargs), _images(batch, image, device), _vision_loss
    return build


def _vision_loss(out):
    """Classifiers return logits; segmentation models a dict whose ``"out"`` is the map."""
    return _mean_loss(out["out"] if isinstance(out, dict) else out)


def _resnet50(device, size):
    import_torchvision()
    from torchvision.models import resnet50
    batch, image = (1, 224) if size == "small" else (32, 224)
    return resnet50(), _images(batch, image, device), _mean_loss


def _vit(device, size):
    import_torchvision()
    from torchvision.models import vit_b_16
    batch = 1 if size == "small" else 32
    return vit_b_16(), _images(batch, 224, device), _mean_loss


MODELS = [
    SuiteModel("llama", _llama), SuiteModel("gpt", _gpt), SuiteModel("convnet", _convnet),
    SuiteModel("mlp", _mlp), SuiteModel("hf_gpt2", _hf_gpt2, "transformers"),
    SuiteModel("hf_bert", _hf_bert, "transformers"),
    SuiteModel("hf_llama", _hf_llama, "transformers"), SuiteModel("hf_qwen2", _hf_qwen2, "transformers"),
    SuiteModel("hf_t5", _hf_t5, "transformers"),
    SuiteModel("decode", _decode, training=False),
    SuiteModel("hf_llama_decode", _hf_llama_decode, "transformers", training=False),
    SuiteModel("resnet18", _torchvision("resnet18"), "torchvision", "vision"),
    SuiteModel("resnet50", _resnet50, "torchvision", "vision"),
    SuiteModel("efficientnet_b0", _torchvision("efficientnet_b0"), "torchvision", "vision"),
    SuiteModel("mobilenet_v3_large", _torchvision("mobilenet_v3_large"), "torchvision", "vision"),
    SuiteModel("convnext_tiny", _torchvision("convnext_tiny"), "torchvision", "vision"),
    SuiteModel("regnet_y_400mf", _torchvision("regnet_y_400mf"), "torchvision", "vision"),
    SuiteModel("swin_t", _torchvision("swin_t"), "torchvision", "vision"),
    SuiteModel("vit_b_16", _vit, "torchvision", "vision"),
    # a segmentation network: dilated ResNet-50 backbone and FCN head, 8 images on a GPU
    SuiteModel("fcn_resnet50", _torchvision("fcn_resnet50", gpu_batch=8, cpu_batch=1, weights_backbone=None,
                                            aux_loss=False), "torchvision", "vision"),
]


def missing(entry: SuiteModel) -> str | None:
    """Why ``entry`` cannot run here, or None."""
    if not entry.needs:
        return None
    try:
        if importlib.util.find_spec("torchvision") is not None:
            import_torchvision()  # transformers imports torchvision where it is installed
        __import__(entry.needs)
    except Exception as error:  # noqa: BLE001 - an optional package that fails to import
        return f"{entry.needs} is not importable ({type(error).__name__}: {error})"
    return None


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["MODELS", "SuiteModel", "import_torchvision", "missing", "parameter_count"]


def cpu_step(name: str, variant: str, compile_model: Callable) -> Callable[[], None]:
    """One step of suite model ``name`` (small, CPU) compiled by ``compile_model(model)``:
    a forward under ``no_grad`` for ``inference-*`` variants, forward and backward of the
    loss for ``training-*`` ones; the compile times (benchmarks/compile_*.py) time its
    first call."""
    model, inputs, loss_fn, training = cpu_model(name, variant)
    return step_of(compile_model(model), inputs, loss_fn, training)


def cpu_model(name: str, variant: str) -> tuple[nn.Module, tuple, Callable, bool]:
    """Suite model ``name`` (small, CPU) for ``variant``: (the model in train or eval mode, its
    inputs, its loss function, whether the variant trains)."""
    entry = next(m for m in MODELS if m.name == name)
    training = variant.startswith("training")
    torch.manual_seed(0)
    model, make_inputs, loss_fn = entry.build("cpu", "small")
    model.train(training)
    return model, tuple(make_inputs(1)), loss_fn, training


def step_of(compiled: Callable, inputs: tuple, loss_fn: Callable, training: bool) -> Callable[[], None]:
    """One step of ``compiled`` on ``inputs``: forward under ``no_grad``, or forward and backward."""

    def step():
        if training:
            loss_fn(compiled(*inputs)).backward()
        else:
            with torch.no_grad():
                compiled(*inputs)
    return step
