"""Have a release's own vLLM check a serve config the way it would start from it, without an engine.

Runs ON the host, with the new release's interpreter, before anything is switched or restarted: a flag,
a value or a combination vLLM refuses stops the deploy for that host while the old service keeps serving.

Three steps, each catching what the one before cannot:
1. exact option names (vLLM's parser accepts abbreviations: `--max-model 512` passes);
2. vLLM's parser on the file (`serve --config`), then every setting of the file compared with the
   namespace it produced: a dropped `false` or a list value whose words override another flag
   (`[hermes, --host, 0.0.0.0]`) is a difference, so a refusal; so is any change of where it listens,
   its model, remote code, parallel sizes or API key from the plan (plan_refusals), in the file or not;
   then `serve`'s own argument checks;
3. for a model on this host's disk, vLLM's own engine config built from that namespace as `vllm serve`
   builds it (EngineArgs.create_engine_config: the model's config.json, quantization, context length,
   cache, scheduler and parallel checks, the platform's adjustments), offline; every setting of
   effective.ENGINE must come out as the file says. What vLLM decides later, in its workers (the
   attention backend, a hybrid model's block size), is not built here.
Every setting is compared by what the release's parser makes of its key (meanings): `no-enable-x`,
`disable-x` and `enable-x` are all the setting enable-x, on or off as that parser says.
Every file or directory the config names (a chat template, LoRA modules, a tokenizer, SSL files, media
and download paths) must be reachable by whoever runs this: a deploy runs it as the service, in the
unit's sandbox (validate_in_unit.py), so a path the service cannot read or write fails here, before any
restart, not in the restarted service.
On success it writes CONFIG.yaml.at-default: the settings equal to the parser's defaults, which vLLM's
start-up log leaves out, and the keys whose setting their spelling does not say (both read by the check
after the restart), and, for a key-guarded config,
CONFIG.yaml.routes.json: the routes the app registers, which the smoke test probes without the key.
The route is the same in vLLM 0.31-0.33. With --findings TOKEN both are printed on stdout instead, one
line each (`TOKEN .at-default {...}`), after every other line: a check run in the unit's sandbox has
nowhere root reads to write them (validate_in_unit.py takes them from the lines).

Usage: python validate_serve.py CONFIG.yaml [--api-key-expected] [--findings TOKEN] [--model-on-disk]
                                [--device cuda|cpu]
       (exit 0 = accepted; 1 = rejected, reason on stderr)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if TYPE_CHECKING:  # the modules uploaded beside this script, as the type checker finds them
    from vllm_fleet.host import effective
else:
    import effective  # uploaded beside this script

# The plan guards the instance with its key (InstancePlan.key_guarded); the key itself never comes here.
KEY_EXPECTED = "--api-key-expected"
FINDINGS = "--findings"  # the findings as stdout lines starting with this run's token
# the findings, by the suffix of the file each is written to beside the staged config
AT_DEFAULT, ROUTES = ".at-default", ".routes.json"
IMPORTED = ".imported"  # with --findings: the release's source files imported, for their bytecode
MODEL_ON_DISK = "--model-on-disk"  # the deploy staged or fetched the model: one the service cannot read fails
GUARD = "vllm_fleet_keyguard.KeyGuard"  # core/plan.py's KEYGUARD: what --middleware must hold with a key
DEVICE = "--device"  # the build's accelerator (cuda, cpu): a CUDA build checked where no GPU is visible


def gpu_visible() -> bool:
    """What vLLM's CUDA platform plugin asks before it picks CUDA: NVML starts and counts a device.
    Where it does not (a staging host, a container without the devices), vLLM finds no platform and
    fails with "Failed to infer device type" instead of a verdict."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return False
        count = ctypes.c_uint(0)
        found = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 and count.value > 0
        nvml.nvmlShutdown()
        return found
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def ticking(label: str, every: float = 3.0):
    """A line every few seconds while vLLM imports and builds its config (seconds on a CPU host, longer
    for a CUDA build's first import), so a validation is never a silent minute."""
    import threading
    import time

    done, t0 = threading.Event(), time.monotonic()

    def tick() -> None:  # os.write, not print: no buffered line is lost or doubled when the process ends
        while not done.wait(every):
            os.write(1, f"{label}: {time.monotonic() - t0:.0f} s\n".encode())

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _refuse(msg: str) -> int:
    print(f"vLLM rejected the config: {msg}", file=sys.stderr)
    return 1


def _one_line(e: Exception) -> str:
    """pydantic's multi-line report as one line, without its type tags and links."""
    lines = [ln.strip() for ln in str(e).splitlines()
             if ln.strip() and not ln.strip().startswith("For further information")]
    text = re.sub(r"\s*\[type=[^\]]*\]", "", " ".join(lines))
    return f"{type(e).__name__}: {text[:1500]}"


def options_of(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every option string the parser takes, hidden ones included: vLLM 0.33 pairs `--enable-x` with
    `--disable-x` and keeps `--no-enable-x` working but drops it from the action's option_strings (and
    from help), so the actions' own lists would refuse a spelling the parser takes."""
    return dict(parser._option_string_actions)


def meanings(config: dict, options: dict[str, argparse.Action], parser: argparse.ArgumentParser
             ) -> dict[str, tuple[str, Any]]:
    """key -> (its setting, as vLLM's non-default args line spells it, the value vLLM's parser gives
    it). `no-enable-x: true`, `disable-x: true` and `no-disable-x: true` are all settings of x: a
    value-less option is asked what it stores, so every release's negations and inverse aliases mean
    what that release's parser makes of them, not what their spelling suggests."""
    out = {}
    for key, value in config.items():
        action = options[f"--{key}"]
        # help and version print and exit: never run here (vLLM's parser refuses them in a config later)
        if (value is True and action.nargs == 0
                and not isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            scratch = argparse.Namespace()
            try:
                action(parser, scratch, [], f"--{key}")
            except BaseException as e:  # an action that exits or raises: never read as accepted
                raise ValueError(f"--{key}: vLLM's option could not be read ({type(e).__name__})") from None
            value = getattr(scratch, action.dest, value)
        out[key] = (action.dest.replace("_", "-"), value)
    return out


def _parsed(want: dict[str, Any], ns: argparse.Namespace) -> dict[str, Any]:
    return {setting: getattr(ns, setting.replace("-", "_"), None) for setting in want}


def _at_default(want: dict[str, Any], serve: argparse.ArgumentParser, ns: argparse.Namespace) -> list:
    """Settings whose parsed value is the parser's default: vLLM leaves them out of its `non-default
    args` line, so the check after the restart needs to know them (written beside the staged file)."""
    return sorted(s for s in want if getattr(ns, s.replace("-", "_"), None) == serve.get_default(
        s.replace("-", "_")))


# What decides where the API listens, who may call it, which code it runs and on how many GPUs: each
# must come out of vLLM's parser as the plan says, set in the file or not (then at the parser's
# default), so a word spliced into argv by the config loader (a list value, a stray positional that
# becomes the model) can never change them.
GUARDED = ("host", "port", "model", "trust_remote_code", "tensor_parallel_size", "pipeline_parallel_size",
           "data_parallel_size", "headless", "nnodes", "node_rank", "master_addr", "master_port")


def plan_refusals(config: dict, ns: argparse.Namespace, default: Callable[[str], Any],
                  key_expected: bool) -> list[str]:
    """Differences between the plan (the file, and the parser's defaults for what it leaves out) and
    the namespace on the settings of GUARDED, and any API key on the namespace.

    Why the key separately: the file never holds one (the key reaches vLLM as VLLM_API_KEY from the
    0600 env file, which this check does not see), and vLLM takes `--api-key` over that variable, so any
    value there replaces the secret, and an empty one turns authentication off.
    """
    want = effective.expected(config)
    out = []
    for dest in GUARDED:
        key = dest.replace("_", "-")
        planned = want.get(key, default(dest))
        got = getattr(ns, dest, None)
        if effective.norm(got) != effective.norm(planned):
            out.append(f"{key}: the plan has {planned!r}, vLLM's parser made it {got!r}")
    tag = getattr(ns, "model_tag", None)
    if tag is not None and effective.norm(tag) != effective.norm(want.get("model")):
        out.append(f"model: the plan has {want.get('model')!r}, vLLM would serve {tag!r} (a stray word "
                   "became its positional model)")
    if key_expected and list(getattr(ns, "middleware", None) or []) != [GUARD]:
        out.append(f"middleware: the plan has [{GUARD!r}] (the key guard), vLLM's parser made it "
                   f"{getattr(ns, 'middleware', None)!r}")
    if getattr(ns, "grpc", False):
        out.append("grpc: vLLM would serve its gRPC frontend, which checks no API key")
    if getattr(ns, "api_key", None) is not None:
        planned_key = ("the instance's key from its env file" if key_expected
                       else "no key (the port is loopback-only or protected elsewhere)")
        out.append(f"api-key: the plan has {planned_key}; vLLM's parser set --api-key, which replaces "
                   "VLLM_API_KEY (an empty one turns authentication off)")
    return out


_HINTS = {"distributed-executor-backend": " (the CPU platform keeps 'uni' only with "
                                          "VLLM_ENABLE_V1_MULTIPROCESSING=0 in the instance's env)"}


def _reach(path: str) -> str | None:
    """Why this process cannot use `path`, or None."""
    hint = f" ({effective.SANDBOX_HIDES})" if effective.hidden_by_sandbox(path) else ""
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
    except FileNotFoundError:
        return f"not found where the service runs{hint}"
    except OSError as e:
        return f"the service's user cannot read it ({e.strerror})"
    return None


def _writable(path: str) -> str | None:
    """Why this process cannot write at `path` (created when missing: its nearest existing parent)."""
    probe = path
    while not os.path.exists(probe) and probe != "/":
        probe = os.path.dirname(probe)
    if not os.access(probe, os.W_OK):
        return f"the service's user cannot write there ({probe} is read-only to it)"
    return None


def unreachable(config: dict) -> list[str]:
    """`key: path: why` for each path the config names that this process cannot read (or write)."""
    out = []
    for key, value in config.items():
        for path in dict.fromkeys(effective.config_paths(key, value)):
            why = _writable(path) if key in effective.WRITE_PATHS else _reach(path)
            if why:
                out.append(f"{key}: {path}: {why}")
    return out


def _engine_check(ns: argparse.Namespace, want: dict) -> dict[str, Any]:
    """vLLM's engine config built as `vllm serve` builds it (the API server's defaults, headless for
    workers), compared with the file: {"error": why} or {"diff": [...]}."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            vllm_config = AsyncEngineArgs.from_cli_args(ns).create_engine_config(
                usage_context=UsageContext.OPENAI_API_SERVER,
                headless=bool(getattr(ns, "headless", False)))
    except Exception as e:  # vLLM raises ValueError, pydantic's ValidationError, and others
        return {"error": _one_line(e)}
    return {"diff": effective.differences(want, effective.engine_values(vllm_config),
                                          "vLLM's engine config has")}


def main(argv: list[str]) -> int:
    findings: dict[str, Any] = {}
    with ticking(f"validating {os.path.basename(argv[0])}"):
        rc = _main(argv, findings)
    if rc == 0:
        token = argv[argv.index(FINDINGS, 1) + 1] if FINDINGS in argv[1:-1] else None
        if token:  # the release's modules this check imported: root compiles them (validate_in_unit)
            findings[IMPORTED] = sorted(
                f for m in list(sys.modules.values())
                if isinstance(f := getattr(m, "__file__", None), str) and f.endswith(".py")
                and f.startswith(sys.prefix + os.sep))
        for suffix, value in findings.items():  # after the ticks stopped: no line is split by one
            if token:
                print(f"{token} {suffix} {json.dumps(value)}", flush=True)
            else:
                with open(f"{argv[0]}{suffix}", "w") as f:
                    json.dump(value, f)
    return rc


def _main(argv: list[str], findings: dict[str, Any]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a check never downloads
    device = argv[argv.index(DEVICE, 1) + 1] if DEVICE in argv[1:-1] else None
    # a CUDA build where no GPU is visible: the parser's checks run on vLLM's CPU platform, and the
    # engine config (the GPU's own checks) is left to vLLM's start on the serving host
    no_gpu = device == "cuda" and "VLLM_TARGET_DEVICE" not in os.environ and not gpu_visible()
    if no_gpu:
        os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    import yaml
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    path = argv[0]
    key_expected = KEY_EXPECTED in argv[1:]
    parser = FlexibleArgumentParser(prog="vllm")
    sub = parser.add_subparsers(dest="subcommand")
    ServeSubcommand().subparser_init(sub)
    serve = sub.choices["serve"]
    options = options_of(serve)
    with open(path) as f:
        config = yaml.safe_load(f) or {}
    if not isinstance(config, dict):
        return _refuse(f"the file holds a {type(config).__name__}, not a mapping of options")
    unknown = [k for k in config if f"--{k}" not in options]
    if unknown:
        off = [k for k in unknown
               if k.startswith(effective.NO) and f"--{k.removeprefix(effective.NO)}" in options]
        hint = (f" ({', '.join(off)}: this vLLM has no way to turn these off; leave them out, off is "
                "their default)") if off else ""
        print(f"vLLM does not know these flags: {', '.join(unknown)}{hint}", file=sys.stderr)
        return 1
    try:
        meant = meanings(config, options, serve)
    except ValueError as e:
        return _refuse(str(e))
    by_setting: dict[str, list[str]] = {}
    for key, (setting, _) in meant.items():
        by_setting.setdefault(setting, []).append(key)
    both = next((keys for keys in by_setting.values() if len(keys) > 1), None)
    if both:
        return _refuse(f"{' and '.join(both)} are both set: they are one setting of vLLM's "
                       f"({meant[both[0]][0]}), and it takes the last one")
    want = {setting: value for setting, value in meant.values()}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(["serve", "--config", path])
    except SystemExit as e:
        msg = [line for line in err.getvalue().splitlines() if "error" in line.lower()] or [err.getvalue()]
        _refuse(" ".join(msg).strip())
        return int(e.code or 1)
    except (ValueError, argparse.ArgumentError) as e:
        return _refuse(str(e))
    diff = effective.differences(want, _parsed(want, ns), "vLLM's parser made it")
    if diff:
        return _refuse("vLLM would not run with what the file says: " + "; ".join(diff))
    off_plan = plan_refusals(want, ns, serve.get_default, key_expected)
    if off_plan:
        return _refuse("vLLM's parser made these differ from the plan: " + "; ".join(off_plan))
    blocked = unreachable(config)
    if blocked:
        return _refuse(f"the service could not use what these name, as user {_user()}: " + "; ".join(blocked))
    try:  # what `vllm serve` checks right after parsing (tool-call parser, chat template, ...)
        with contextlib.redirect_stdout(io.StringIO()):
            ServeSubcommand().validate(ns)
    except Exception as e:
        return _refuse(f"vLLM would refuse to start: {_one_line(e)}")
    model = getattr(ns, "model_tag", None) or getattr(ns, "model", None)
    # building the engine config imports a trust_remote_code model's own code: as the service, in its
    # sandbox (validate_in_unit.py), that is what the restart would run anyway; never as root
    remote_code = bool(config.get("trust-remote-code")) and os.geteuid() == 0
    if MODEL_ON_DISK in argv[1:] and isinstance(model, str) and model.startswith("/"):
        # staged, fetched or already on the host: a directory the service cannot read would start nothing
        why = _reach(model)
        if why:
            return _refuse(f"the service could not use its model, as user {_user()}: {model}: {why}")
    engine = bool(model and os.path.isdir(model)) and not remote_code and not no_gpu
    if engine:
        ns.model = model
        found = _engine_check(ns, want)
        if found.get("error"):
            return _refuse(f"vLLM would refuse to start: {found['error']}")
        if found["diff"]:
            return _refuse("vLLM would change these settings: " + "; ".join(
                d + _HINTS.get(d.split(":", 1)[0], "") for d in found["diff"]))
    findings[AT_DEFAULT] = {"at_default": _at_default(want, serve, ns),
                               "settings": {k: [setting, v] for k, (setting, v) in meant.items()
                                            if (setting, v) != (k, config[k])}}
    if config.get("middleware"):
        # the routes the key guard must cover (vllm_fleet/host/keyguard.py), listed while vLLM is imported
        # anyway; the smoke test probes each of them without the key after the restart
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "asgi"))
        sys.dont_write_bytecode = True  # nothing written beside the guard in vLLM's PYTHONPATH
        if TYPE_CHECKING:
            from vllm_fleet.host import keyguard as vllm_fleet_keyguard
        else:
            import vllm_fleet_keyguard

        findings[ROUTES] = vllm_fleet_keyguard.routes(path)
    if engine:
        print("accepted (parser and engine config)")
    elif no_gpu:
        print("accepted (parser; no GPU is visible on this host, so vLLM checks the CUDA engine config when "
              "it starts)")
    elif remote_code:
        print("accepted (parser; trust_remote_code: the model's code runs only as the service, so vLLM "
              "checks the engine config when it starts)")
    else:
        print("accepted (parser; the model is not on this host yet, so vLLM checks it when it starts)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
