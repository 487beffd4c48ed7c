"""Kernel registry (verify/registry.py): every way a target can fail to load is
a one-line KernelLoadError naming the target, and ``fa2-verify kernels`` lists
targets, capabilities and whether they run here."""

from __future__ import annotations

import sys

import pytest

from fa2_verify.core.contract import Capabilities
from fa2_verify.kernels.reference import DEFERRED
from fa2_verify.cli.main import main
from fa2_verify.core.errors import KernelLoadError
from fa2_verify.verify.registry import BUNDLED, load_kernel


class _NoForward:
    capabilities = DEFERRED.capabilities


class _NoCapabilities:
    def forward(self, q, k, v, *, softmax_scale, causal=False, window_size=(-1, -1)):
        return DEFERRED.forward(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size)


class _DictCapabilities(_NoCapabilities):
    capabilities = DEFERRED.capabilities.as_dict()


class _Hostile(_NoCapabilities):
    """A target whose hook ``hook`` raises ``raised``; every other hook is the reference's."""

    def __init__(self, hook: str, raised: BaseException) -> None:
        self.hook, self.raised = hook, raised

    def _maybe_raise(self, hook: str) -> None:
        if hook == self.hook:
            raise self.raised

    @property
    def capabilities(self):
        self._maybe_raise("capabilities")
        return DEFERRED.capabilities

    def unavailable_reason(self):
        self._maybe_raise("unavailable_reason()")
        return None

    def config(self):
        self._maybe_raise("config()")
        return {}


def _exits():
    sys.exit(0)


class _MisspelledCapabilities(_NoCapabilities):
    capabilities = {"dtypes": {"cpu": ["float32"]}, "head_dims": [32], "seqlen_multiple": 16}


NO_FORWARD = _NoForward()
NO_CAPABILITIES = _NoCapabilities()
DICT_CAPABILITIES = _DictCapabilities()
EXITING_CAPABILITIES = _Hostile("capabilities", SystemExit(0))
INTERRUPTED_CAPABILITIES = _Hostile("capabilities", KeyboardInterrupt())
EXITING_UNAVAILABLE_REASON = _Hostile("unavailable_reason()", SystemExit(3))
INTERRUPTED_UNAVAILABLE_REASON = _Hostile("unavailable_reason()", KeyboardInterrupt())
EXITING_CONFIG = _Hostile("config()", SystemExit(0))
FAILING_CONFIG = _Hostile("config()", ValueError("no tile table for this GPU"))
MISSPELLED_CAPABILITIES = _MisspelledCapabilities()


class _ForwardNotCallable(_DictCapabilities):
    forward = "flash"


FORWARD_NOT_CALLABLE = _ForwardNotCallable()

BAD_TARGETS = {
    "unknown-name": ("no-such-kernel", f"unknown kernel 'no-such-kernel': use one of {', '.join(sorted(BUNDLED))}, or module:attr"),
    "import-failure": ("tests.no_such_module:KERNEL", "kernel 'tests.no_such_module:KERNEL': cannot import module 'tests.no_such_module'"),
    "missing-attribute": ("tests.mutants:NO_SUCH_MUTANT", "module 'tests.mutants' has no attribute 'NO_SUCH_MUTANT'"),
    "lacks-forward": ("tests.test_registry:NO_FORWARD", "target 'tests.test_registry:NO_FORWARD' lacks 'forward'"),
    "lacks-capabilities": ("tests.test_registry:NO_CAPABILITIES", "lacks 'capabilities', required by the kernel contract"),
    "forward-not-callable": (
        "tests.test_registry:FORWARD_NOT_CALLABLE", "'forward' of 'tests.test_registry:FORWARD_NOT_CALLABLE' is str, not callable"
    ),
    "unknown-capability-field": (
        "tests.test_registry:MISSPELLED_CAPABILITIES",
        "kernel 'tests.test_registry:MISSPELLED_CAPABILITIES': capabilities has unknown field(s) ['seqlen_multiple']",
    ),
}


@pytest.mark.parametrize("name, message", BAD_TARGETS.values(), ids=BAD_TARGETS.keys())
def test_bad_target_raises_one_line_load_error(name: str, message: str) -> None:
    with pytest.raises(KernelLoadError) as info:
        load_kernel(name)
    assert message in str(info.value) and "\n" not in str(info.value)


#: target -> the one-line error of loading it and calling every hook.
HOSTILE_HOOKS = {
    "capabilities-exits": ("EXITING_CAPABILITIES", "capabilities raised SystemExit: 0"),
    "capabilities-interrupts": ("INTERRUPTED_CAPABILITIES", "capabilities raised KeyboardInterrupt"),
    "unavailable-reason-exits": ("EXITING_UNAVAILABLE_REASON", "unavailable_reason() raised SystemExit: 3"),
    "unavailable-reason-interrupts": ("INTERRUPTED_UNAVAILABLE_REASON", "unavailable_reason() raised KeyboardInterrupt"),
    "config-exits": ("EXITING_CONFIG", "config() raised SystemExit: 0"),
    "config-raises": ("FAILING_CONFIG", "config() raised ValueError: no tile table for this GPU"),
}


@pytest.mark.parametrize("attr, message", HOSTILE_HOOKS.values(), ids=HOSTILE_HOOKS.keys())
def test_a_hook_that_raises_anything_is_a_load_error_naming_it(attr: str, message: str) -> None:
    name = f"tests.test_registry:{attr}"
    with pytest.raises(KernelLoadError) as info:
        kernel = load_kernel(name)
        kernel.unavailable_reason("cpu")
        kernel.config()
    assert str(info.value) == f"kernel {name!r}: {message}"


LISTED_HOOKS = {key: value for key, value in HOSTILE_HOOKS.items() if not key.startswith("config")}


@pytest.mark.parametrize("attr, message", LISTED_HOOKS.values(), ids=LISTED_HOOKS.keys())
def test_kernels_command_exits_2_on_a_hook_it_calls_that_raises(attr: str, message: str, capsys) -> None:
    assert main(["kernels", f"tests.test_registry:{attr}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and message in captured.err


@pytest.mark.parametrize(
    "source, message",
    [
        ("import sys\nsys.exit(0)\n", "cannot import module 'exits_on_import': SystemExit: 0"),
        ("raise KeyboardInterrupt\n", "cannot import module 'exits_on_import': KeyboardInterrupt"),
        ("def __getattr__(name):\n    raise SystemExit(5)\n", "reading 'KERNEL' raised SystemExit: 5"),
    ],
    ids=["sys-exit", "keyboard-interrupt", "module-getattr-exits"],
)
def test_a_module_that_exits_on_import_is_a_load_error(tmp_path, monkeypatch, source: str, message: str) -> None:
    (tmp_path / "exits_on_import.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "exits_on_import", raising=False)
    with pytest.raises(KernelLoadError) as info:
        load_kernel("exits_on_import:KERNEL")
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["reference", "reference-eager", "torch-flash"])
def test_bundled_cpu_targets_load(name: str) -> None:
    kernel = load_kernel(name)
    assert kernel.name == name and isinstance(kernel.capabilities, Capabilities)
    assert kernel.unavailable_reason("cpu") is None


def test_plain_dict_capabilities_load_as_the_class() -> None:
    kernel = load_kernel("tests.test_registry:DICT_CAPABILITIES")
    assert kernel.capabilities == DEFERRED.capabilities


def test_module_attr_target_loads() -> None:
    kernel = load_kernel("fa2_verify.kernels.reference:EAGER")
    assert kernel.config()["rescaling"] == "eager"


def test_kernels_command_lists_capabilities(capsys) -> None:
    assert main(["kernels", "reference", "torch-flash"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["kernel", "devices/dtypes", "head", "dims", "features", "runs", "here"]
    rows = {line.split()[0]: line for line in lines[1:] if not line.startswith(" ")}
    assert "cpu: float16,bfloat16,float32,float64; cuda: float16,bfloat16,float32,float64" in rows["reference"]
    assert " 1..512 " in rows["reference"] and "causal,window,gqa,backward,deterministic " in rows["reference"]
    assert "cpu: yes" in rows["reference"] and "cpu: yes" in rows["torch-flash"]
    assert "cpu: float16,bfloat16,float32,float64; cuda: float16,bfloat16" in rows["torch-flash"]
    assert any(line.strip().startswith("note: cpu: seqlen_q=0 or seqlen_k=0 is unsupported") for line in lines)


def test_kernels_command_shows_a_gqa_dkv_summed_in_any_order(capsys) -> None:
    """flash-attn-4 declares gqa_dkv_reproducible=False: the listing says so (it loads without the package)."""
    assert main(["kernels", "flash-attn-4"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("flash-attn-4"))
    assert "causal,window,gqa,backward,varlen,gqa-dkv-unordered" in row


@pytest.mark.parametrize(
    "names, message",
    [(["nosuch"], "unknown kernel 'nosuch'"), (["reference", "tests.no_such_module:KERNEL"], "cannot import module")],
    ids=["unknown-name", "one-of-two-fails-to-import"],
)
def test_kernels_command_exits_2_on_a_target_it_cannot_load(names, message, capsys) -> None:
    assert main(["kernels", *names]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and message in captured.err


def test_kernels_command_lists_every_bundled_target(capsys) -> None:
    assert main(["kernels"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:] if not line.startswith(" ")]
    assert listed == list(BUNDLED)


def test_module_failing_on_import_raises_one_line_load_error(tmp_path, monkeypatch) -> None:
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('CUDA driver too old')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KernelLoadError) as info:
        load_kernel("raises_on_import:KERNEL")
    message = str(info.value)
    assert "cannot import module 'raises_on_import': RuntimeError: CUDA driver too old" in message
    assert "\n" not in message


class _Declaring(_DictCapabilities):
    """A target whose ``config()`` is ``settings``; its ``forward`` must never run."""

    def __init__(self, settings: dict) -> None:
        self.settings = settings

    def config(self):
        return self.settings

    def forward(self, *args, **kwargs):
        pytest.fail("a case ran before config() was checked")


NAN_CONFIG = _Declaring({"tiles": {"fwd": [64, float("nan")]}})
INF_CONFIG = _Declaring({"partial_sums": {"cpu": {"out_splits": float("inf")}}})
BOOL_BLOCK_K = _Declaring({"block_k": True})
ZERO_BLOCK_K = _Declaring({"block_k": 0})
UNKNOWN_PARTIAL_SUM = _Declaring({"partial_sums": {"cpu": {"out_split": 8}}})

#: target -> the field its one-line error names.
BAD_CONFIGS = {
    "nan": ("NAN_CONFIG", "config()['tiles']['fwd'][1] is not a finite number"),
    "inf": ("INF_CONFIG", "config()['partial_sums']['cpu']['out_splits'] is not a finite number"),
    "bool-block-k": ("BOOL_BLOCK_K", "config()['block_k']=True: the key tile must be a positive int"),
    "zero-block-k": ("ZERO_BLOCK_K", "config()['block_k']=0: the key tile must be a positive int"),
    "unknown-field": ("UNKNOWN_PARTIAL_SUM", "config()['partial_sums']['cpu']['out_split'] is not a field"),
}


@pytest.mark.parametrize("attr, message", BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_a_bad_config_is_refused_before_any_case_runs_naming_the_key_path(attr: str, message: str, capsys) -> None:
    case = '{"batch": 1, "seqlen_q": 2, "seqlen_k": 2, "heads_q": 1, "heads_kv": 1, "head_dim": 8, "dtype": "float32"}'
    assert main(["repro", "--kernel", f"tests.test_registry:{attr}", "--case", case]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"fa2-verify: error: kernel 'tests.test_registry:{attr}': config()")
    assert message in captured.err


def test_a_finite_config_with_its_declarations_loads() -> None:
    settings = {"block_k": 16, "version": 2.5, "partial_sums": {"cpu": {"out_splits": [[0, 1], [64, 4]]}}}
    kernel = load_kernel("tests.test_registry:DECLARING")
    assert kernel.config() == settings == DECLARING.settings


DECLARING = _Declaring({"block_k": 16, "version": 2.5, "partial_sums": {"cpu": {"out_splits": [[0, 1], [64, 4]]}}})
