"""Sensitivity of fa2-verify's verdicts, and of the field's rules, to planted bugs of graded size.

    python -m benchmarks.sensitivity [--device cuda] [--kernel triton] [--lengths 2048,16384,65537,131072]
        [--dtypes float16,bfloat16] [--causal both|yes|no] [--max-queries 4096] --out TABLE.md [--overwrite]

Per configuration (length, dtype, causal) one case is built (batch 1, 2 query
and 2 kv heads, head_dim 64, ``normal`` values, backward on; ``seqlen_k`` is the
length, ``seqlen_q`` the length capped at ``--max-queries``, bottom-right
aligned, so the keys past 2^16 are seen by every row while the golden stays
within the GPU budget), and the golden, the correct kernel's outputs and the
naive low-precision attention (:func:`verify.lowprec.naive_attention`, the
field's ``out_pt``) are computed once.  Every planted bug is a perturbation of
the correct outputs, so all rules judge the very same tensors:

* (a) noise on ``out``: every perturbed element moves by ``m`` times its row's
  measured rounding error (``max_c |correct - golden|`` of that row and head,
  at least the dtype's unit roundoff times the row's largest golden entry), with
  random signs, on one row of one head, one tile of 64 rows of one head, or
  every row of one head; ``m`` in :data:`NOISE_MULTIPLES`;
* (b) one key, one block of 64 keys, or every key past 2^16 dropped: ``out``
  and ``lse`` are those of attention without the keys (:func:`without_keys`,
  exact, float64) plus the correct kernel's own rounding error, rounded to the
  output dtype; ``dk`` and ``dv`` of the dropped keys are 0.  ``dq`` and the
  other keys' ``dk``, ``dv`` keep their correct values: a real kernel that drops
  keys errs there too, so each rule's catch is if anything easier in practice;
* (c) one block of 64 keys missing from every row's ``dq``
  (:func:`dq_of_key_block`, float64 from the inputs);
* (d) the last 64 query rows of ``out`` and ``lse`` holding the 64 rows before
  them (a stale last tile);
* (e) ``out`` of one head times ``1 + eps``, ``eps`` in :data:`SCALE_EPSILONS`.

The verdicts, on ``golden`` as the reference (flash-attn's tests use an
``attention_ref`` in float32 where this uses the float64 golden; the golden is
the more exact reference, so their rules only gain from it):

* fa2-verify: :class:`verify.check.OutputJudge`, caught when any output fails; the
  verdict that failed is named (``worst-case``: an element past its bound;
  ``statistical`` and ``local``: the verdicts whose score exceeds 1, where the
  comparison carries them);
* flash-attn 2x (``tests/test_flash_attn.py::test_flash_attn_output``, FA2):
  ``max|K - ref| <= 2 max|pt - ref|`` for ``out``, ``dq``, ``dk``, ``dv``;
* hopper/cute (``hopper/test_flash_attn.py`` and ``tests/cute/test_flash_attn.py``):
  ``max|K - ref| <= rtol max|pt - ref| + atol``, ``rtol = 2``,
  ``atol = 2 max|(ref + 0.3 - 0.3) - ref|`` computed in the output dtype (the
  ``fwd_atol`` of ``out``, and alike for the gradients);
* PyTorch (``test/test_transformers.py::test_flash_attention_vs_math_ref_grads``
  through ``check_out_and_grad``/``_check_equal``): ``max|K - ref| <=
  max(1e-5, fudge max|lp - ref|)`` with the fudge factors of that test
  (:data:`PYTORCH_FUDGE`: out 4, grad_query 180, grad_key 16, grad_value 4;
  earlier releases passed similar factors to ``get_tolerances``).

None of the field's rules reads ``lse``.  A graded bug's cell is the smallest
size caught; every other bug's is yes or no.  The correct kernel's own
verdicts come first: a rule that fails the correct outputs "catches" every bug.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import sys
from typing import Any, Callable, Iterator

import torch

from fa2_verify.core.case import Case, CaseSpec, make_case
from fa2_verify.core.errors import Fa2VerifyError, UsageError
from fa2_verify.verify import check, error_model, metrics
from fa2_verify.core.outputs import check_writable, write_text_atomic
from fa2_verify.verify.kernel_call import run_case
from fa2_verify.app.targets import load_target
from fa2_verify.verify.registry import LoadedKernel, require_device

#: Rows of one query tile and keys of one key block, as the bugs plant them.
TILE = 64
#: The first key index that needs more than 16 bits.
KEYS_PAST = 2**16
NOISE_MULTIPLES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
SCALE_EPSILONS: tuple[float, ...] = tuple(2.0**-power for power in range(12, 3, -1))
#: The outputs the field's rules compare (none reads lse).
FIELD_OUTPUTS = ("out", "dq", "dk", "dv")
#: flash-attn's multiple of the low-precision reference's error (FA2's rule and hopper/cute's rtol).
FLASH_RTOL = 2.0
#: PyTorch test_transformers' fudge factors of test_flash_attention_vs_math_ref_grads, and its floor.
PYTORCH_FUDGE = {"out": 4.0, "dq": 180.0, "dk": 16.0, "dv": 4.0}
PYTORCH_FLOOR = 1e-5
RULES = ("fa2-verify", "flash-attn 2x", "hopper/cute", "PyTorch")
DEFAULT_LENGTHS = (2048, 16384, 65537, 131072)


@dataclasses.dataclass(frozen=True)
class Config:
    length: int
    dtype: str
    causal: bool

    def spec(self, max_queries: int) -> CaseSpec:
        return CaseSpec(batch=1, seqlen_q=min(self.length, max_queries), seqlen_k=self.length, heads_q=2,
                        heads_kv=2, head_dim=64, dtype=self.dtype, causal=self.causal, generator="normal",
                        seed=self.length % 1000 + 1, backward=True)

    def label(self) -> str:
        return f"{self.length} {self.dtype} {'causal' if self.causal else 'none'}"


def _visible_blocks(case: Case, golden: Any, keys: slice) -> Iterator[tuple[int, slice, slice, torch.Tensor]]:
    """``(batch, rows, keys, P)`` over the rows that see a key of ``keys``: ``P = exp(scale q k^T - lse)``,
    float64 (heads_q, rows, keys), 0 where the mask hides the key, one row block at a time
    (:func:`verify.error_model.row_blocks` on the mask clipped to ``keys``)."""
    spec = case.spec
    device = case.q.device
    first, last = spec.visible_ranges(device)
    first, last = first.clamp(min=keys.start), last.clamp(max=keys.stop - 1)
    group = spec.heads_q // spec.heads_kv
    work = error_model.work_elements(device)
    for rows, span in error_model.row_blocks(first, last, work, spec.head_dim):
        if span.stop <= span.start:
            continue
        key_index = torch.arange(span.start, span.stop, device=device)
        visible = (key_index >= first[rows, None]) & (key_index <= last[rows, None])
        for b in range(spec.batch):
            q_rows = case.q[b, rows].to(torch.float64).transpose(0, 1)
            k_span = case.k[b, span].to(torch.float64).transpose(0, 1).repeat_interleave(group, 0)
            logits = (q_rows @ k_span.mT) * spec.scale - golden.lse[b, :, rows, None]
            yield b, rows, span, torch.where(visible, torch.exp(logits), 0.0)


def _values(case: Case, b: int, span: slice, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor[b, span]`` (k, v or the like) in float64, as (heads_q, keys, head_dim)."""
    group = case.spec.heads_q // case.spec.heads_kv
    return tensor[b, span].to(torch.float64).transpose(0, 1).repeat_interleave(group, 0)


def without_keys(case: Case, golden: Any, keys: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)``, float64, of attention that never sees the keys ``keys``.

    With ``P = exp(S - lse)`` the golden's probabilities and ``s_i`` the mass row
    ``i`` gives the dropped keys, the rest renormalises: ``out' = (out - P_J V_J) /
    (1 - s)`` and ``lse' = lse + log(1 - s)``; a row left without a visible key
    has ``out' = 0`` and ``lse' = -inf``, as the kernel contract asks.
    """
    out, lse = golden.out.clone(), golden.lse.clone()
    for b, rows, span, probs in _visible_blocks(case, golden, keys):
        kept = 1.0 - probs.sum(-1)
        removed = probs @ _values(case, b, span, case.v)
        out[b, rows] = ((golden.out[b, rows].transpose(0, 1) - removed) / kept[..., None]).transpose(0, 1)
        lse[b, :, rows] = golden.lse[b, :, rows] + torch.log(kept)
    first, last = case.spec.visible_ranges(out.device)
    hidden = (last.clamp(max=keys.stop - 1) - first.clamp(min=keys.start) + 1).clamp(min=0)
    empty = (last - first + 1).clamp(min=0) == hidden
    out[:, empty] = 0.0
    lse[:, :, empty] = float("-inf")
    return out, lse


def dq_of_key_block(case: Case, golden: Any, keys: slice) -> torch.Tensor:
    """The part of ``dq`` the keys ``keys`` contribute, float64: ``scale dS[:, keys] K[keys]`` with
    ``dS = P (dout V^T - delta)`` from the golden's ``lse`` and ``delta``."""
    dq = torch.zeros_like(golden.dq)
    for b, rows, span, probs in _visible_blocks(case, golden, keys):
        dout_rows = case.dout[b, rows].to(torch.float64).transpose(0, 1)
        dprobs = dout_rows @ _values(case, b, span, case.v).mT
        dlogits = probs * (dprobs - golden.delta[b, :, rows, None])
        dq[b, rows] = (case.spec.scale * dlogits @ _values(case, b, span, case.k)).transpose(0, 1)
    return dq


class Setting:
    """One configuration: the case, its golden, the correct outputs, and every rule's verdict on outputs."""

    def __init__(self, kernel: LoadedKernel, spec: CaseSpec, device: str):
        self.kernel = kernel
        self.case = make_case(spec, device)
        self.golden = check.golden_for(self.case)
        self.correct = run_case(kernel, self.case)
        self.judge = check.OutputJudge(kernel, self.case, self.golden, self.correct)
        self.naive = self.judge.naive
        self.baseline = self._compare(self.correct)
        self.reference_error = {name: self._max_error(self.naive[name], name) for name in FIELD_OUTPUTS}
        self.noise_atol = {name: self._rounding_atol(name) for name in FIELD_OUTPUTS}
        self.generator = torch.Generator(device="cpu").manual_seed(spec.seed)

    def _compare(self, actual: dict[str, torch.Tensor]) -> dict[str, metrics.OutputComparison]:
        return self.judge.compare(actual)

    def _max_error(self, tensor: torch.Tensor, name: str) -> float:
        """``max |tensor - golden|``; a NaN counts as an infinite error, as the field's asserts fail on it."""
        difference = (tensor.to(torch.float64) - getattr(self.golden, name)).abs()
        return float(torch.nan_to_num(difference, nan=float("inf")).max())

    def _rounding_atol(self, name: str) -> float:
        """hopper/cute's atol: ``2 max|(ref + 0.3 - 0.3) - ref|`` in the output dtype."""
        reference = getattr(self.golden, name).to(self.correct[name].dtype)
        return 2 * float(((reference + 0.3 - 0.3) - reference).abs().max())

    def verdicts(self, changed: dict[str, torch.Tensor], rules: tuple[str, ...] = RULES) -> dict[str, str]:
        """``{rule: how it caught}`` ("" when it did not) for the correct outputs with ``changed`` put in."""
        result = {}
        if "fa2-verify" in rules:
            comparisons = self.baseline | self._compare(changed)
            failed = sorted({verdict for comparison in comparisons.values() for verdict in comparison.failed_verdicts})
            caught = not all(comparison.passed for comparison in comparisons.values())
            result["fa2-verify"] = ("+".join(failed) or "failed") if caught else ""
        actual = self.correct | changed
        errors = {name: self._max_error(actual[name], name) for name in FIELD_OUTPUTS}
        limits = {
            "flash-attn 2x": {name: FLASH_RTOL * self.reference_error[name] for name in FIELD_OUTPUTS},
            "hopper/cute": {name: FLASH_RTOL * self.reference_error[name] + self.noise_atol[name]
                            for name in FIELD_OUTPUTS},
            "PyTorch": {name: max(PYTORCH_FLOOR, PYTORCH_FUDGE[name] * self.reference_error[name])
                        for name in FIELD_OUTPUTS},
        }
        for rule, limit in limits.items():
            if rule in rules:
                result[rule] = ",".join(name for name in FIELD_OUTPUTS if errors[name] > limit[name])
        return result

    # ---- planted bugs: each yields (size, changed outputs), sizes ascending ----

    def _rounded(self, name: str, exact: torch.Tensor) -> torch.Tensor:
        """``exact`` (float64) plus the correct kernel's own rounding error in ``name``, rounded to its dtype."""
        correct = self.correct[name]
        own_error = correct.to(torch.float64) - getattr(self.golden, name)
        return (exact + torch.nan_to_num(own_error)).to(correct.dtype)

    def noise(self, scope: str) -> Iterator[tuple[float, dict[str, torch.Tensor]]]:
        spec = self.case.spec
        out = self.correct["out"].to(torch.float64)
        golden = self.golden.out
        unit = error_model.unit_roundoff(self.correct["out"].dtype)
        row_error = torch.maximum((out - golden).abs().amax(-1), unit * golden.abs().amax(-1))
        row = spec.seqlen_q // 3
        where = {"row": (slice(row, row + 1), 0), "tile": (slice(row - row % TILE, row - row % TILE + TILE), 0),
                 "head": (slice(None), 1)}[scope]
        rows, head = where
        signs = torch.randint(0, 2, out[0, rows, head].shape, generator=self.generator).to(out.device) * 2.0 - 1.0
        for multiple in NOISE_MULTIPLES:
            noisy = out.clone()
            noisy[0, rows, head] += multiple * row_error[0, rows, head, None] * signs
            yield multiple, {"out": noisy.to(self.correct["out"].dtype)}

    def dropped(self, keys: slice) -> Iterator[tuple[float, dict[str, torch.Tensor]]]:
        out, lse = without_keys(self.case, self.golden, keys)
        changed = {"out": self._rounded("out", out), "lse": self._rounded("lse", lse)}
        for name in ("dk", "dv"):
            changed[name] = self.correct[name].clone()
            changed[name][:, keys] = 0
        yield 0, changed

    def lost_dq_block(self, keys: slice) -> Iterator[tuple[float, dict[str, torch.Tensor]]]:
        missing = dq_of_key_block(self.case, self.golden, keys)
        yield 0, {"dq": (self.correct["dq"].to(torch.float64) - missing).to(self.correct["dq"].dtype)}

    def stale_last_tile(self) -> Iterator[tuple[float, dict[str, torch.Tensor]]]:
        out, lse = self.correct["out"].clone(), self.correct["lse"].clone()
        out[:, -TILE:] = self.correct["out"][:, -2 * TILE:-TILE]
        lse[:, :, -TILE:] = self.correct["lse"][:, :, -2 * TILE:-TILE]
        yield 0, {"out": out, "lse": lse}

    def scaled_head(self) -> Iterator[tuple[float, dict[str, torch.Tensor]]]:
        for epsilon in SCALE_EPSILONS:
            out = self.correct["out"].to(torch.float64).clone()
            out[:, :, 1] *= 1 + epsilon
            yield epsilon, {"out": out.to(self.correct["out"].dtype)}

    def bugs(self) -> dict[str, Callable[[], Iterator[tuple[float, dict[str, torch.Tensor]]]] | None]:
        """Bug class -> its graded perturbations; None where the case cannot hold the bug."""
        spec = self.case.spec
        middle = spec.seqlen_k // 2
        block = slice(middle - middle % TILE, middle - middle % TILE + TILE)
        return {
            "(a) noise, one row": lambda: self.noise("row"),
            "(a) noise, one tile of rows": lambda: self.noise("tile"),
            "(a) noise, one head": lambda: self.noise("head"),
            "(b) one key dropped": lambda: self.dropped(slice(middle, middle + 1)),
            "(b) one key block dropped": lambda: self.dropped(block),
            "(b) keys past 2^16 dropped": (lambda: self.dropped(slice(KEYS_PAST, spec.seqlen_k)))
            if spec.seqlen_k > KEYS_PAST else None,
            "(c) one block's dQ update lost": lambda: self.lost_dq_block(block),
            "(d) stale rows in the last tile": self.stale_last_tile if spec.seqlen_q >= 2 * TILE else None,
            "(e) out of one head x (1 + eps)": self.scaled_head,
        }


GRADED = {"(a)": "m", "(e)": "eps"}


def smallest_caught(setting: Setting, perturbations: Iterator[tuple[float, dict[str, torch.Tensor]]]
                    ) -> dict[str, tuple[float, str] | None]:
    """``{rule: (smallest size caught, how)}``, None for a rule no size caught; sizes ascending, each rule
    judged until it catches."""
    found: dict[str, tuple[float, str] | None] = {rule: None for rule in RULES}
    for size, changed in perturbations:
        pending = tuple(rule for rule in RULES if found[rule] is None)
        if not pending:
            break
        for rule, how in setting.verdicts(changed, pending).items():
            if how:
                found[rule] = (size, how)
    return found


def _cell(bug: str, result: tuple[float, str] | None) -> str:
    unit = GRADED.get(bug[:3])
    if result is None:
        largest = {"m": NOISE_MULTIPLES[-1], "eps": "2^-4"}.get(unit or "")
        return f"no (up to {unit} = {largest})" if unit else "no"
    size, how = result
    if unit == "eps":
        return f"eps = 2^{round(math.log2(size))} ({how})"
    if unit == "m":
        return f"m = {int(size)} ({how})"
    return f"yes ({how})"


def config_rows(setting: Setting, label: str, progress: Callable[[str], None] = lambda line: None
                ) -> tuple[list[str], list[list[str]]]:
    """``(baseline row, bug rows)`` of one configuration: every rule on the correct outputs, then per bug
    class the smallest size each rule caught."""
    spec = setting.case.spec
    verdicts = setting.verdicts({})
    baseline = [label, f"{spec.seqlen_q} x {spec.seqlen_k}"] + [
        f"FAILS ({verdicts[rule]})" if verdicts[rule] else "passes" for rule in RULES]
    rows = []
    for bug, perturbations in setting.bugs().items():
        if perturbations is None:
            rows.append([bug, label] + ["n/a"] * len(RULES))
            continue
        found = smallest_caught(setting, perturbations())
        rows.append([bug, label] + [_cell(bug, found[rule]) for rule in RULES])
        progress(" | ".join(rows[-1]))
    return baseline, rows


def sensitivity_rows(kernel: LoadedKernel, configs: list[Config], device: str, max_queries: int,
                     progress: Callable[[str], None] = lambda line: None) -> tuple[list[list[str]], list[list[str]]]:
    """``(baseline rows, bug rows)`` of the table, :func:`config_rows` of each configuration in turn."""
    baseline, rows = [], []
    for config in configs:
        setting = Setting(kernel, config.spec(max_queries), device)
        config_baseline, config_bugs = config_rows(setting, config.label(), progress)
        baseline.append(config_baseline)
        rows.extend(config_bugs)
        del setting
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return baseline, rows


def _size_of(cell: str) -> float | None:
    """The size a cell reports caught (0 for a yes), None for a miss or n/a."""
    if cell.startswith("m = "):
        return float(cell.split()[2])
    if cell.startswith("eps = 2^"):
        return 2.0 ** int(cell.split()[2][2:])
    return 0.0 if cell.startswith("yes") else None


def targets(rows: list[list[str]]) -> list[str]:
    """The issue's targets, checked on the bug rows: fa2-verify catches (a) at m <= 8 and (b) to (e) everywhere,
    and is weaker than flash-attn 2x in no row."""
    misses, weaker = [], []
    for row in rows:
        bug, label, ours, flash = row[0], row[1], row[2], row[3]
        if ours == "n/a":
            continue
        size = _size_of(ours)
        if size is None or (bug.startswith("(a)") and size > 8):
            misses.append(f"{bug}, {label}")
        flash_size = _size_of(flash)
        if flash_size is not None and (size is None or size > flash_size):
            weaker.append(f"{bug}, {label}")
    return [
        f"* fa2-verify catches every (a) at m <= 8 and every (b)-(e): "
        + ("**met**" if not misses else f"**missed** in {len(misses)} rows: " + "; ".join(misses)),
        f"* fa2-verify never weaker than flash-attn 2x: "
        + ("**met**" if not weaker else f"**weaker** in {len(weaker)} rows: " + "; ".join(weaker)),
    ]


def markdown(device_name: str, command: str, baseline: list[list[str]], rows: list[list[str]]) -> str:
    def table(header: list[str], body: list[list[str]]) -> list[str]:
        return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)] + ["| " + " | ".join(r) + " |"
                                                                                   for r in body]

    lines = ["# Sensitivity to planted bugs", "", f"Device: {device_name}", "", f"Command: `{command}`", "",
             "## The correct kernel", ""]
    lines += table(["config", "seqlen_q x seqlen_k"] + list(RULES), baseline)
    lines += ["", "## Smallest planted bug caught", ""]
    lines += table(["bug", "config"] + list(RULES), rows)
    lines += ["", "## Targets", ""] + targets(rows)
    return "\n".join(lines) + "\n"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--kernel", default=None, help="default: triton on cuda, reference on cpu")
    parser.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)))
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--causal", default="both", choices=("both", "yes", "no"))
    parser.add_argument("--max-queries", type=int, default=4096)
    parser.add_argument("--out", required=True, help="the Markdown table (.md)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    return parser.parse_args(argv)


def configs_of(lengths: str, dtypes: str, causal: str) -> list[Config]:
    """The configurations the options name; a bad value is a one-line :class:`UsageError`."""
    try:
        parsed = [int(length) for length in lengths.split(",")]
    except ValueError:
        raise UsageError(f"--lengths={lengths!r}: expected comma-separated integers") from None
    if any(length < 2 * TILE for length in parsed):
        raise UsageError(f"--lengths={lengths!r}: every length must be at least {2 * TILE} (two tiles)")
    names = dtypes.split(",")
    if any(name not in ("float16", "bfloat16") for name in names):
        raise UsageError(f"--dtypes={dtypes!r}: use float16 and/or bfloat16")
    masks = {"both": (False, True), "yes": (True,), "no": (False,)}[causal]
    return [Config(length, dtype, mask) for length in parsed for dtype in names for mask in masks]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    command = "python -m benchmarks.sensitivity " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        if args.max_queries < 2 * TILE:
            raise UsageError(f"--max-queries={args.max_queries}: must be at least {2 * TILE}")
        configs = configs_of(args.lengths, args.dtypes, args.causal)
        check_writable(args.out, overwrite=args.overwrite, flag="--out")
        require_device(args.device)
        kernel = load_target(args.kernel or ("reference" if args.device == "cpu" else "triton"))
        device_name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
        baseline, rows = sensitivity_rows(kernel, configs, args.device, args.max_queries,
                                          progress=lambda line: print(line, flush=True))
        text = markdown(f"{device_name}, kernel {kernel.name}, torch {torch.__version__}", command, baseline, rows)
        write_text_atomic(args.out, text, overwrite=args.overwrite, flag="--out")
    except Fa2VerifyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
