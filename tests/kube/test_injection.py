"""No injection through the policy or the options: every string reaches the YAML as a value that
PyYAML quotes, so the text parses back to exactly the objects that were built, with no extra
document, key or type change. Job names are DNS labels (validated), so strings go in through
args, the checkpoint path, the image and environment values."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from templates_helpers import (
    KUBERNETES_VERSIONS,
    MINIMAL,
    by_kind,
    load_all,
    object_errors,
    policy_of,
    schema_errors,
)

from nvtrain.kube.manifest import render
from nvtrain.kube.options import ManifestOptions
from nvtrain.kube.yaml_io import dump

NASTY = [
    'it\'s "quoted"',
    "key: value",
    "- item",
    "a #comment",
    "\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: stolen\n",
    "...",
    "${HOME} $(id) `id`",
    "{{ .Values.x }} {% raw %}",
    "&anchor *alias",
    "!!python/object/apply:os.system ['id']",
    "| > %YAML 1.1",
    "yes",
    "no",
    "on",
    "null",
    "~",
    "0x1F",
    "1e3",
    "010",
    "2026-01-01",
    "",
    " leading and trailing ",
    "tab\tin",
    "line\nbreak",
    "crlf\r\nline",
    "trailing spaces   \nnext",
    "next line\x85here",
    "line separator\u2028here",
    "bom\ufeffhere",
    "emoji 🚀 and ünïcödé",
    "back\\slash",
    "bell \x07 del \x7f",  # NUL is refused by validate (test_hardening_manifest.py)
]


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string (control characters escaped)."""
    out = []
    for ch in value:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def policy_text(
    args: list[str], directory: str = "/checkpoints", script: str = "train.py", name: str = "llm-train"
) -> str:
    return (
        "[job]\n"
        f'name = "{name}"\n'
        f"script = {toml_string(script)}\n"
        f"args = [{', '.join(toml_string(a) for a in args)}]\n"
        "[checkpoint]\n"
        f"dir = {toml_string(directory)}\n"
    )


def round_trip(text: str, options: ManifestOptions | None = None) -> list[dict[str, Any]]:
    """Render, dump, parse back; assert the parsed objects equal the built ones."""
    policy = policy_of(text)
    assert policy.job.args  # the strings really went through the policy
    objects = render(policy, text, options)
    parsed = load_all(dump(objects))
    assert parsed == objects
    assert [o["kind"] for o in parsed] == [o["kind"] for o in objects]
    assert by_kind(parsed, "ConfigMap")["data"]["policy.toml"] == text
    return parsed


@pytest.mark.parametrize("nasty", NASTY, ids=range(len(NASTY)))
def test_nasty_strings_in_args_script_and_env_round_trip_and_stay_valid(nasty: str) -> None:
    text = policy_text(["--note", nasty, nasty + nasty], script=f"/opt/{nasty}/train.py")
    env_value = nasty
    image = "registry.example.com:5000/ml/" + "".join(c for c in nasty if c.isprintable() and not c.isspace())
    options = ManifestOptions(image=image.rstrip("/") or "x", env={"NOTE": env_value})
    objects = round_trip(text, options)
    job = by_kind(objects, "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in container["env"]}["NOTE"] == env_value
    assert container["image"] == options.image
    for version in KUBERNETES_VERSIONS:
        errors = [e for e in (schema_errors(o, version) for o in objects) if e]
        assert not errors, errors


@pytest.mark.parametrize(
    "directory",
    # no ':' (Kubernetes allows none in a mountPath: test_hardening_manifest.py)
    ['/ckpt/it\'s "here"', "/ckpt/{a}", "/ckpt/${HOME}", "/ckpt/#x", "/ckpt/- y", "/ckpt/yes", "/ckpt/ü 🚀"],
)
def test_checkpoint_paths_round_trip_into_the_mount(directory: str) -> None:
    objects = round_trip(policy_text(["--x"], directory=directory))
    mounts = by_kind(objects, "Job")["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {m["name"]: m["mountPath"] for m in mounts}["checkpoints"] == directory
    for version in KUBERNETES_VERSIONS:
        assert all(schema_errors(o, version) is None for o in objects)


@pytest.mark.parametrize("nasty", NASTY, ids=range(len(NASTY)))
def test_nasty_strings_round_trip_through_the_jobset_variant(nasty: str) -> None:
    """The JobSet carries the same strings through its replicated Job's template; parsed back it
    is exactly what was built, and its fields and its Job template stay valid."""
    text = policy_text(
        ["--note", nasty, nasty + nasty], script=f"/opt/{nasty}/train.py", name="llm-workers-0"
    )
    options = ManifestOptions(jobset=True, env={"NOTE": nasty}, image="registry.example.com:5000/ml/x:1")
    objects = round_trip(text, options)
    assert [o["kind"] for o in objects] == ["ConfigMap", "NetworkPolicy", "JobSet"]
    [replicated] = by_kind(objects, "JobSet")["spec"]["replicatedJobs"]
    container = replicated["template"]["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in container["env"]}["NOTE"] == nasty
    for version in KUBERNETES_VERSIONS:
        errors = [e for o in objects for e in object_errors(o, version)]
        assert not errors, errors


def test_injected_documents_stay_inside_the_jobset_configmap() -> None:
    attack = "\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: stolen\n"
    parsed = round_trip(policy_text([attack], name="llm-workers-0"), ManifestOptions(jobset=True))
    assert [o["kind"] for o in parsed] == ["ConfigMap", "NetworkPolicy", "JobSet"]


def test_a_policy_file_with_crlf_line_ends_is_kept_byte_for_byte() -> None:
    text = MINIMAL.replace("\n", "\r\n") + 'args = ["a  ", "\\tb"]\r\n'
    round_trip(text)


def test_injected_documents_stay_inside_the_configmap_string() -> None:
    attack = "\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: stolen\n"
    text = policy_text([attack]) + f"# {attack.replace(chr(10), chr(10) + '# ')}\n"
    parsed = round_trip(text)
    assert [o["kind"] for o in parsed] == ["ConfigMap", "Service", "NetworkPolicy", "Job"]


_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
_ARG = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=40)


@given(args=st.lists(_ARG, min_size=1, max_size=4), env_value=_TEXT, jobset=st.booleans())
def test_any_args_and_env_values_round_trip(args: list[str], env_value: str, jobset: bool) -> None:
    name = "llm-workers-0" if jobset else "llm-train"
    round_trip(policy_text(args, name=name), ManifestOptions(env={"X": env_value}, jobset=jobset))


@given(
    image=st.text(
        st.characters(
            exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp"), exclude_characters="\x85\u180e\ufeff"
        ),
        min_size=1,
        max_size=60,
    ).filter(lambda s: not any(c.isspace() for c in s))
)
def test_any_image_without_whitespace_round_trips(image: str) -> None:
    round_trip(policy_text(["--x"]), ManifestOptions(image=image))
