"""Several processes: what a run's topology is, refusing launches that silently run copies, and FSDP2.

Why (issue 25, measured with accelerate 1.16 / torch 2.13 on CPU): ``accelerate launch --num_processes 2
--cpu`` starts ONE non-distributed process; two ``accelerate launch --cpu --num_machines 2
--machine_rank {0,1}`` start two unrelated single-process runs that both write one run folder; an
accelerate config with ``distributed_type: FSDP`` and ``use_cpu: true`` runs plain DDP. Each of these
exits 0 having trained something other than what was asked. Here:

- ``check_launch(num_processes)``: a process started by a multi-process launcher (``WORLD_SIZE`` > 1 from
  torchrun / accelerate / deepspeed, ``SLURM_NTASKS`` > 1 inside ``srun``, or a parent ``accelerate
  launch`` whose flags or config file ask for several processes or machines) that finds itself alone
  (``Accelerator().num_processes == 1``) stops with a ``UserError`` naming the launch that works.
- ``gather_topology(accel, cfg)`` -> ``Topology``: world size, nodes (distinct node ranks, or hosts),
  processes per node, strategy and prompts per rank; ``announce`` prints it on rank 0, writes
  ``topology.json`` in the run folder and returns the ``dist/*`` metrics logged once at step 0.
- ``distributed.strategy: fsdp2``: torch's own ``torch.distributed.fsdp.fully_shard`` (FSDP2, the engine
  TRL / accelerate / torchtitan use; not our own sharding) per transformer block (the model's
  ``_no_split_modules``: Qwen2.5-VL's decoder layers and vision blocks), the root last;
  ``reshard_after_forward`` for the blocks (the root keeps its weights gathered between its forward and
  backward, FSDP2's default for the root: the fused log-prob path multiplies by the LM head's weight after
  the forward); ``MixedPrecisionPolicy`` (float32 gradient reduction) on GPU only.
  Parameters become ``DTensor``s holding 1/world of each sharded tensor, so parameters, gradients and
  AdamW state are sharded. ``shard_model`` must run before the optimizer is built (it replaces the
  parameters), and such a model is NOT given to ``accelerate.prepare`` (that would wrap it in DDP).
- ``gathered(model)``: FSDP2 all-gathers a block's weights in every forward. HF ``generate`` runs one
  forward per token, and ranks whose prompts finish early stop calling forward (a rank waiting in an
  all-gather the other never joins hangs). Generation therefore runs with every block unsharded for
  the whole call (one all-gather per block per ``generate``) and no collective per token;
  ``GatheredEngine`` wraps a rollout engine's ``generate`` in it.

References: torch FSDP2 tutorial (https://docs.pytorch.org/tutorials/intermediate/FSDP_tutorial.html),
``torch.distributed.fsdp.fully_shard``; torchrun's environment (``RANK``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``: https://docs.pytorch.org/docs/stable/elastic/run.html).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from mmrlvr.errors import UserError
from mmrlvr.metric import Metric

STRATEGIES = ("ddp", "fsdp2")
TOPOLOGY_FILE = "topology.json"

WORKING_LAUNCH = ("torchrun --nproc_per_node N -m mmrlvr.cli train CONFIG (one node), torchrun --nnodes M "
                  "--nproc_per_node N --node_rank R --master_addr HOST --master_port PORT ... (several), or "
                  "accelerate launch --config_file F.yaml with distributed_type: MULTI_GPU and num_processes: N in F, "
                  "also on CPU (see docs/scaling.md)")


# --------------------------------------------------------------------------------------------- launch
def _int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def parent_cmdline(pid: int | None = None) -> list[str]:
    """The command line of this process's parent (Linux ``/proc``); [] where it cannot be read."""
    pid = os.getppid() if pid is None else pid
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a for a in raw.decode(errors="replace").split("\0") if a]


def _flag(argv: list[str], *names: str) -> str | None:
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def accelerate_request(argv: list[str]) -> dict[str, int] | None:
    """Processes and machines an ``accelerate launch`` command line asks for (flags over its config file).

    None when ``argv`` is not an ``accelerate launch``. ``--num_processes`` is the total over machines.

    >>> accelerate_request(["python", "-m", "accelerate.commands.launch", "--num_processes", "2", "--cpu", "x.py"])
    {'processes': 2, 'machines': 1}
    >>> accelerate_request(["python", "train.py"]) is None
    True
    """
    joined = " ".join(argv[:4])
    is_launch = ("accelerate" in joined and "launch" in joined) or any(
        a.endswith("accelerate.commands.launch") for a in argv[:4])
    if not is_launch:
        return None
    req = {"processes": 1, "machines": 1}
    cfg_file = _flag(argv, "--config_file", "--config-file")
    if cfg_file:
        try:
            import yaml

            data = yaml.safe_load(Path(cfg_file).read_text()) or {}
            req["processes"] = _int(data.get("num_processes")) or 1
            req["machines"] = _int(data.get("num_machines")) or 1
        except Exception:  # noqa: BLE001 - an unreadable file: accelerate itself reports it
            pass
    for key, names in (("processes", ("--num_processes", "--num-processes")),
                       ("machines", ("--num_machines", "--num-machines"))):
        value = _int(_flag(argv, *names))
        if value:
            req[key] = value
    return req


def expected_world_size(env: dict[str, str] | None = None, parent: list[str] | None = None) -> tuple[int, str]:
    """How many processes this run's launcher asked for, and which launcher said so ((1, "") if none).

    >>> expected_world_size({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, [])
    (2, 'WORLD_SIZE=2 (torchrun / accelerate / deepspeed)')
    >>> expected_world_size({"SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"}, [])
    (4, 'SLURM_NTASKS=4 (srun started 4 tasks)')
    >>> expected_world_size({}, ["accelerate", "launch", "--cpu", "--num_machines", "2", "x.py"])[0]
    2
    """
    env = dict(os.environ) if env is None else env
    ws = _int(env.get("WORLD_SIZE"))
    if ws and ws > 1:
        return ws, f"WORLD_SIZE={ws} (torchrun / accelerate / deepspeed)"
    tasks = _int(env.get("SLURM_NTASKS"))
    if tasks and tasks > 1 and "SLURM_STEP_ID" in env and not ws:
        return tasks, f"SLURM_NTASKS={tasks} (srun started {tasks} tasks)"
    parent = parent_cmdline() if parent is None else parent
    req = accelerate_request(parent)
    if req and max(req["processes"], req["machines"]) > 1:
        n = max(req["processes"], req["machines"])
        return n, (f"the parent `{shlex.join(parent[:12])}` asks for {req['processes']} process(es) on "
                   f"{req['machines']} machine(s)")
    return 1, ""


def check_launch(num_processes: int, env: dict[str, str] | None = None, parent: list[str] | None = None) -> None:
    """Stop a process that a multi-process launcher started but that runs alone (a silent copy).

    Raises ``UserError`` when the launcher asked for more processes than ``num_processes`` (what
    ``Accelerator().num_processes`` says this process belongs to), or when ``WORLD_SIZE`` disagrees with it.
    """
    expected, how = expected_world_size(env, parent)
    if num_processes == expected or (expected == 1 and num_processes > 1):
        return
    if num_processes == 1:
        raise UserError(
            f"distributed: this process was started for a {expected}-process run ({how}) but runs alone "
            f"(accelerate found 1 process; on CPU, `accelerate launch --num_processes N --cpu` and `--num_machines "
            f"M --cpu` start independent single processes). Training would run {expected} unrelated copies. "
            f"Launch with {WORKING_LAUNCH}")
    raise UserError(f"distributed: the launcher asked for {expected} processes ({how}) but accelerate found "
                    f"{num_processes}; check the launch command ({WORKING_LAUNCH})")


def one_process_only(option: str, why: str, env: dict[str, str] | None = None,
                     parent: list[str] | None = None) -> list[str]:
    """A validation problem when this launch starts several processes and ``option`` cannot run on them.

    For methods whose state or passes are not (yet) correct across ranks: refused before any model loads,
    naming the option, instead of training something other than the method."""
    world, how = expected_world_size(env, parent)
    if world <= 1:
        return []
    return [f"{option}: runs on one process only ({why}); this launch starts {world} ({how}). Train it with one "
            f"process, or choose another method"]


#: what ``accelerate launch`` puts in its processes' environment for a config with ``distributed_type: FSDP``
ACCELERATE_FSDP_ENV = ("ACCELERATE_USE_FSDP", "FSDP_VERSION")


def honour_launcher(cfg: Any, env: dict[str, str] | None = None) -> str | None:
    """Make the run's strategy what the launcher asked for; returns a note when it changed it.

    ``accelerate launch --config_file F`` with ``distributed_type: FSDP`` starts the processes with
    ``ACCELERATE_USE_FSDP=true`` and ``FSDP_VERSION``. Left alone, the run trained plain DDP and said
    ``strategy ddp``: what the launcher asked for is not what ran. ``fsdp_version: 2`` maps to
    ``distributed.strategy: fsdp2`` (torch's ``fully_shard``, applied by ``shard_model``); FSDP version 1 is
    refused naming the keys to use. The variable is then removed from this process's environment, so
    accelerate does not build an FSDP plugin of its own beside the sharding applied here. ``env`` (tests)
    defaults to ``os.environ`` and is changed in place.
    """
    env = os.environ if env is None else env
    if str(env.get("ACCELERATE_USE_FSDP", "")).lower() not in ("1", "true", "yes"):
        return None
    version = str(env.get("FSDP_VERSION", "1")).strip()
    if version != "2":
        raise UserError(f"distributed.strategy: the accelerate config asks for FSDP version {version} "
                        f"(distributed_type: FSDP); mmrlvr shards with FSDP2. Set fsdp_version: 2 in the accelerate "
                        f"config, or use distributed_type: MULTI_GPU there and distributed.strategy: fsdp2 (or ddp) "
                        f"in the run config")
    for key in ACCELERATE_FSDP_ENV:
        env.pop(key, None)
    section = getattr(cfg, "distributed", None)
    before = getattr(section, "strategy", "ddp")
    if before == "fsdp2":
        return None
    section.strategy = "fsdp2"
    return (f"distributed.strategy: {before} -> fsdp2, because the accelerate config asks for FSDP "
            f"(distributed_type: FSDP, fsdp_version: 2)")


def check_strategy(strategy: str, where: str = "config") -> list[str]:
    """Problems with ``distributed.strategy`` (one line each)."""
    if strategy not in STRATEGIES:
        return [f"{where}: distributed.strategy: unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}"]
    return []


# ------------------------------------------------------------------------------------------- topology
@dataclass
class Topology:
    """Who trains: sizes, strategy and the prompts each rank takes per step."""

    world_size: int
    num_nodes: int
    procs_per_node: list[int]  # processes on each node, by node
    strategy: str  # ddp | fsdp2 (as run: fsdp2 at world size 1 runs unsharded)
    backend: str  # gloo | nccl | none
    prompts_per_step: int
    prompts_per_rank: list[int]
    hosts: list[str] = field(default_factory=list)  # per rank
    launcher: str = ""
    #: the log-prob passes of the run's first step on rank 0, by path (``mmrlvr.train.forward.PASS_COUNTS``:
    #: prefix_shared / fused / logits), filled in after that step: whether several processes kept prefix sharing
    passes: dict[str, int] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        values = {"dist/world_size": self.world_size, "dist/nodes": self.num_nodes,
                  "dist/procs_per_node": max(self.procs_per_node or [1]),
                  "dist/prompts_per_rank": self.prompts_per_rank[0] if self.prompts_per_rank else 0,
                  "dist/fsdp2": self.strategy == "fsdp2"}
        return {k: Metric.same(float(v)) for k, v in values.items()}

    def line(self) -> str:
        nodes = "+".join(str(n) for n in self.procs_per_node)
        return (f"distributed: world size {self.world_size} ({self.num_nodes} node(s) x {nodes} process(es)), "
                f"strategy {self.strategy}, backend {self.backend}, {self.prompts_per_step} prompts per step = "
                f"{' + '.join(str(n) for n in self.prompts_per_rank)} per rank")


def _all_gather(obj: Any, world: int) -> list[Any]:
    import torch.distributed as dist

    if world <= 1 or not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def gather_topology(num_processes: int, process_index: int, strategy: str, prompts_per_step: int,
                    env: dict[str, str] | None = None) -> Topology:
    """The run's topology (collective: every rank must call it). Nodes are told apart by the launcher's
    node rank (torchrun ``GROUP_RANK``, SLURM ``SLURM_NODEID``), else by host name."""
    env = dict(os.environ) if env is None else env
    node = env.get("GROUP_RANK") or env.get("NODE_RANK") or env.get("SLURM_NODEID")
    host = socket.gethostname()
    mine = (node if node is not None else host, host)
    every = _all_gather(mine, num_processes)
    order: list[str] = []
    for key, _h in every:
        if key not in order:
            order.append(key)
    per_node = [sum(1 for k, _ in every if k == key) for key in order]
    per = prompts_per_step // max(num_processes, 1)
    import torch.distributed as dist

    backend = dist.get_backend() if num_processes > 1 and dist.is_available() and dist.is_initialized() else "none"
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env else ("slurm" if "SLURM_JOB_ID" in env else
                                                               ("accelerate" if "ACCELERATE_USE_CPU" in env
                                                                or "ACCELERATE_MIXED_PRECISION" in env else "none"))
    return Topology(world_size=num_processes, num_nodes=len(order), procs_per_node=per_node,
                    strategy=strategy,
                    backend=str(backend), prompts_per_step=prompts_per_step,
                    prompts_per_rank=[per] * num_processes, hosts=[h for _k, h in every], launcher=launcher)


def announce(topo: Topology, run_dir: str | Path | None, is_main: bool) -> dict[str, float]:
    """Print the topology on rank 0 and write ``topology.json`` in the run folder; the ``dist/*`` metrics."""
    if is_main:
        print(topo.line(), file=sys.stderr, flush=True)  # a log line: stdout stays the command's result
        if run_dir is not None:
            from mmrlvr.store.atomic import atomic_write_text

            Path(run_dir).mkdir(parents=True, exist_ok=True)
            atomic_write_text(Path(run_dir) / TOPOLOGY_FILE, json.dumps(asdict(topo), indent=2) + "\n")
    return topo.metrics()


def record_passes(topo: Topology, passes: dict[str, int], run_dir: str | Path | None, is_main: bool) -> None:
    """After the first step: which path its log-prob passes took, in ``topology.json`` and as a log line."""
    topo.passes = {k: int(v) for k, v in sorted(passes.items())}
    if is_main:
        words = {"prefix_shared": "prefix-shared", "fused": "whole rows (fused head)", "logits": "whole rows (full logits)"}
        said = ", ".join(f"{n} {words.get(k, k)}" for k, n in topo.passes.items()) or "none"
        print(f"first step's log-prob passes on {topo.world_size} process(es): {said}", file=sys.stderr, flush=True)
        if run_dir is not None and Path(run_dir).is_dir():
            from mmrlvr.store.atomic import atomic_write_text

            atomic_write_text(Path(run_dir) / TOPOLOGY_FILE, json.dumps(asdict(topo), indent=2) + "\n")


def read_topology(run_dir: str | Path) -> dict[str, Any] | None:
    path = Path(run_dir) / TOPOLOGY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


# ---------------------------------------------------------------------------------------------- FSDP2
def is_dtensor(t: Any) -> bool:
    return type(t).__name__ == "DTensor" or "DTensor" in {c.__name__ for c in type(t).__mro__}


def is_sharded(model: torch.nn.Module) -> bool:
    """True when ``model`` (or a submodule) was wrapped by FSDP2's ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def block_classes(model: torch.nn.Module) -> set[str]:
    """Class names of the model's transformer blocks (HF ``_no_split_modules``, through a peft wrapper)."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    return names


def shard_model(model: torch.nn.Module, *, reshard_after_forward: bool = True,
                mixed_precision: bool | None = None) -> torch.nn.Module:
    """FSDP2-shard ``model`` in place over the default process group: each block, then the root.

    ``mixed_precision``: None = on GPU only: parameters gathered in their dtype, gradients reduced in
    float32 (``MixedPrecisionPolicy(reduce_dtype=float32)``); on CPU nothing is cast, so the sharded run
    computes exactly what the unsharded one does. Call before building the optimizer.
    """
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not (dist.is_available() and dist.is_initialized()):
        raise UserError("distributed.strategy: fsdp2 needs a process group (launch with torchrun or accelerate "
                        "launch --config_file; see docs/scaling.md)")
    if is_sharded(model):
        return model
    device = next(model.parameters()).device
    use_mp = device.type == "cuda" if mixed_precision is None else mixed_precision
    kwargs: dict[str, Any] = {"reshard_after_forward": reshard_after_forward}
    if use_mp:
        dtype = next(model.parameters()).dtype
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    if device.type == "cuda":
        from torch.distributed.device_mesh import init_device_mesh

        kwargs["mesh"] = init_device_mesh("cuda", (dist.get_world_size(),))
    elif device.type == "cpu":
        from torch.distributed.device_mesh import init_device_mesh

        kwargs["mesh"] = init_device_mesh("cpu", (dist.get_world_size(),))
    blocks = block_classes(model)
    if not blocks:
        raise UserError(f"distributed.strategy: fsdp2: {type(model).__name__} names no transformer blocks "
                        "(_no_split_modules); cannot choose what to shard")
    for m in list(model.modules()):
        if m is not model and type(m).__name__ in blocks:
            fully_shard(m, **kwargs)
    # the vision tower as a unit of its own (patch embedding, merger): the rollout and the vision-feature
    # cache call it directly, outside the root's forward, so its weights must not depend on the root's hooks
    for name, m in list(model.named_modules()):
        if m is not model and name.rsplit(".", 1)[-1] == "visual":
            fully_shard(m, **kwargs)
    # the root last: embeddings, norms, LM head. Not resharded after its forward (FSDP2's own default for
    # the root): the fused log-prob path reads the LM head's weight after the forward returns
    fully_shard(model, **{**kwargs, "reshard_after_forward": False})
    # FSDP2 makes the first FSDP module that runs a forward the root of the tree; the vision tower runs
    # before the model does (image encoding), so initialise the whole tree from the real root now
    lazy_init = getattr(model._get_fsdp_state(), "_lazy_init", None)  # type: ignore[attr-defined]
    if lazy_init is not None:
        lazy_init()
    return model


def shard(accel: Any, cfg: Any, model: torch.nn.Module, ref_model: torch.nn.Module | None
          ) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """``distributed.strategy: fsdp2`` over several processes: shard the policy and a frozen reference copy
    the same way (a LoRA run's reference is the adapter-off policy, sharded with it). Unchanged otherwise;
    fsdp2 in one process runs unsharded (said once). Call before building the optimizer."""
    if strategy_of(cfg) != "fsdp2":
        return model, ref_model
    if accel.num_processes == 1:
        if accel.is_main_process:
            print("distributed: strategy fsdp2 in one process: nothing to shard, training unsharded", file=sys.stderr,
                  flush=True)
        return model, ref_model
    shard_model(model)
    if ref_model is not None:
        shard_model(ref_model)
    return model, ref_model


def prepare(accel: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
    """``accel.prepare(model, optimizer)``, except that an FSDP2-sharded model is not handed to accelerate
    (it would wrap it in DDP): only the optimizer is prepared."""
    if is_sharded(model):
        return model, accel.prepare(optimizer)
    return accel.prepare(model, optimizer)


def _fsdp_modules(model: torch.nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Every FSDP2 block unsharded for the whole block of code (one all-gather each), none per forward.

    Inside, forwards issue no collective, so ranks may run different numbers of forwards (``generate``
    stopping at different lengths). Afterwards every module is resharded and resharding after forward is
    back as ``shard_model`` set it (blocks yes, the root ``model`` no). A no-op for an unsharded model.
    """
    mods = _fsdp_modules(model)
    if not mods:
        yield model
        return
    handles = [m.unshard(async_op=True) for m in mods]
    for h in handles:
        if h is not None:
            h.wait()
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
    try:
        yield model
    finally:
        for m in mods:
            m.reshard()
            m.set_reshard_after_forward(m is not model, recurse=False)  # as shard_model set them


class GatheredEngine:
    """A rollout engine whose ``generate`` runs inside ``gathered(model)`` (everything else delegated)."""

    def __init__(self, engine: Any, model: torch.nn.Module) -> None:
        self._engine = engine
        self._model = model

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad(), gathered(self._model):
            return self._engine.generate(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def wrap_engine(engine: Any, model: torch.nn.Module) -> Any:
    """``engine`` unchanged for an unsharded model, else a ``GatheredEngine`` (see ``gathered``)."""
    return GatheredEngine(engine, model) if is_sharded(model) else engine


def local_numel(model: torch.nn.Module) -> int:
    """Elements of the parameters this rank holds (a DTensor's local shard)."""
    return sum((p.to_local() if is_dtensor(p) else p).numel() for p in model.parameters())


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Bytes of parameters plus optimizer state this rank holds (DTensors count their local shard)."""
    def nbytes(t: torch.Tensor) -> int:
        t = t.to_local() if is_dtensor(t) else t
        return t.numel() * t.element_size()

    total = sum(nbytes(p) for p in model.parameters())
    if optimizer is not None:
        for st in optimizer.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    total += nbytes(v)
    return total


def strategy_of(cfg: Any) -> str:
    """``cfg.distributed.strategy`` (``ddp`` when the config has no distributed section)."""
    section = getattr(cfg, "distributed", None)
    return getattr(section, "strategy", "ddp") or "ddp"


def setup(accel: Any, cfg: Any, run_dir: str | Path | None = None) -> Topology:
    """At the start of a run (every rank): refuse a lone copy, gather and announce the topology.

    Stores the ``dist/*`` metrics on the returned topology's ``metrics()``; the caller logs them once.
    """
    check_launch(accel.num_processes)
    problems = check_strategy(strategy_of(cfg))
    if problems:
        raise UserError(problems[0])
    topo = gather_topology(accel.num_processes, accel.process_index, strategy_of(cfg),
                           int(cfg.rollout.prompts_per_step))
    announce(topo, run_dir, accel.is_main_process)
    return topo


def print_rank0(message: str) -> None:
    if os.environ.get("RANK", "0") in ("", "0"):
        print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def stop_all_ranks_on_failure(command: str = "mmrlvr train", env: dict[str, str] | None = None) -> Iterator[None]:
    """A rank that fails ends its process at once, with its message, so the launcher stops every rank.

    Why: a rank that raises and then exits normally runs interpreter clean-up (destructors, the process
    group, accelerate's state) that may wait on the other ranks, while they wait for it in their next
    collective: nobody says anything and the run hangs until gloo's / NCCL's 30-minute timeout. Here the
    failing rank prints ``rank R of W failed: <what>`` (the traceback too, unless it is a ``UserError``)
    and leaves with ``os._exit``: torchrun's agent sees it within a fraction of a second and terminates the
    other ranks, and ranks on other nodes get a closed connection in their next collective. One process:
    exceptions pass through unchanged (the command line reports them).
    """
    env = dict(os.environ) if env is None else env
    world = _int(env.get("WORLD_SIZE")) or 1
    try:
        yield
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure of a rank must end it
        if world <= 1:
            raise
        rank = env.get("RANK", "?")
        if not isinstance(exc, UserError):
            traceback.print_exc(file=sys.stderr)
        print(f"{command}: rank {rank} of {world} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(2 if isinstance(exc, UserError) else 130 if isinstance(exc, KeyboardInterrupt) else 1)
