#!/usr/bin/env python3
"""Checks META.json against the PGXN Meta Spec 1.0.0 (https://pgxn.org/spec/).

No validator is packaged for Debian (PGXN::Meta::Validator is on CPAN
only), so this is a validator of our own: the required keys, the type and
form of every key the spec defines, and that no key outside the spec is
used unless it starts with "x_" or "X_".

    meta.py spec SRC       META.json is valid JSON and valid PGXN metadata
    meta.py versions SRC   its version, provides' version, the control file's
                           default_version and debian/changelog's upstream
                           version are one version

Prints what is wrong and exits 1, or exits 0 silently.
"""
import json
import os
import re
import sys

# SemVer 1.0.0, as the spec requires for "version"
SEMVER = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)([A-Za-z][0-9A-Za-z-]*)?$")
# a version range: a version, or comma-separated "op version" clauses
RANGE_CLAUSE = re.compile(r"^\s*(==|!=|>=|<=|>|<)?\s*(\S+)\s*$")
LICENSES = {
    "agpl_3", "apache_1_1", "apache_2_0", "artistic_1", "artistic_2", "bsd",
    "freebsd", "gfdl_1_2", "gfdl_1_3", "gpl_1", "gpl_2", "gpl_3", "lgpl_2_1",
    "lgpl_3_0", "mit", "mozilla_1_0", "mozilla_1_1", "openssl", "perl_5",
    "postgresql", "qpl_1_0", "ssleay", "sun", "zlib", "open_source",
    "restricted", "unrestricted", "unknown",
}
PHASES = {"configure", "build", "test", "runtime", "develop"}
RELATIONS = {"requires", "recommends", "suggests", "conflicts"}
TOP = {
    "name", "version", "abstract", "maintainer", "license", "provides",
    "meta-spec", "description", "generated_by", "tags", "no_index",
    "prereqs", "release_status", "resources",
}
REQUIRED = ["name", "version", "abstract", "maintainer", "license", "provides", "meta-spec"]

errors = []


def err(msg):
    errors.append(msg)


def custom(key):
    return key.startswith(("x_", "X_"))


def is_str(v):
    return isinstance(v, str) and v != ""


def check_term(where, v):
    # names and tags: no whitespace at the ends, no control characters, no
    # slash or backslash
    if not is_str(v) or v != v.strip() or re.search(r"[\x00-\x1f\x7f/\\]", v):
        err(f"{where}: not a valid term: {v!r}")


def check_version(where, v):
    if not isinstance(v, str) or not SEMVER.match(v):
        err(f"{where}: not a semantic version: {v!r}")


def check_range(where, v):
    if v == 0 or v == "0":
        return
    if not isinstance(v, str):
        err(f"{where}: not a version range: {v!r}")
        return
    for clause in v.split(","):
        m = RANGE_CLAUSE.match(clause)
        if not m or not SEMVER.match(m.group(2)):
            err(f"{where}: not a version range: {v!r}")
            return


def check_uri(where, v):
    if not isinstance(v, str) or not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:\S+$", v):
        err(f"{where}: not a URI: {v!r}")


def check_path(src, where, v):
    if not is_str(v) or v.startswith("/") or ".." in v.split("/"):
        err(f"{where}: not a relative path: {v!r}")
    elif not os.path.isfile(os.path.join(src, v)):
        err(f"{where}: {v} does not exist")


def check_object(where, v, allowed):
    if not isinstance(v, dict):
        err(f"{where}: not an object")
        return False
    for k in v:
        if k not in allowed and not custom(k):
            err(f"{where}: unknown key {k!r}")
    return True


def spec(src, meta):
    if not check_object("META.json", meta, TOP):
        return
    for k in REQUIRED:
        if k not in meta:
            err(f"required key {k!r} missing")
    if "name" in meta:
        check_term("name", meta["name"])
        if isinstance(meta["name"], str) and len(meta["name"]) < 2:
            err("name: shorter than two characters")
    if "version" in meta:
        check_version("version", meta["version"])
    for k in ("abstract", "description", "generated_by"):
        if k in meta and not is_str(meta[k]):
            err(f"{k}: not a non-empty string")
    if "maintainer" in meta:
        m = meta["maintainer"]
        if not (is_str(m) or (isinstance(m, list) and m and all(is_str(x) for x in m))):
            err("maintainer: not a string or a list of strings")
    if "license" in meta:
        lic = meta["license"]
        if isinstance(lic, str):
            if lic not in LICENSES:
                err(f"license: {lic!r} is not one of the spec's names")
        elif isinstance(lic, list) and lic:
            for x in lic:
                if x not in LICENSES:
                    err(f"license: {x!r} is not one of the spec's names")
        elif isinstance(lic, dict) and lic:
            for name, url in lic.items():
                check_uri(f"license.{name}", url)
        else:
            err("license: not a string, list or object")
    if "provides" in meta and check_object("provides", meta["provides"], set(meta["provides"]) if isinstance(meta["provides"], dict) else set()):
        if not meta["provides"]:
            err("provides: empty")
        for ext, p in meta["provides"].items():
            check_term(f"provides key {ext!r}", ext)
            if not check_object(f"provides.{ext}", p, {"file", "version", "abstract", "docfile"}):
                continue
            for k in ("file", "version"):
                if k not in p:
                    err(f"provides.{ext}: required key {k!r} missing")
            if "file" in p:
                check_path(src, f"provides.{ext}.file", p["file"])
            if "docfile" in p:
                check_path(src, f"provides.{ext}.docfile", p["docfile"])
            if "version" in p:
                check_version(f"provides.{ext}.version", p["version"])
            if "abstract" in p and not is_str(p["abstract"]):
                err(f"provides.{ext}.abstract: not a non-empty string")
    if "meta-spec" in meta and check_object("meta-spec", meta["meta-spec"], {"version", "url"}):
        if meta["meta-spec"].get("version") != "1.0.0":
            err("meta-spec.version: not 1.0.0")
        if "url" in meta["meta-spec"]:
            check_uri("meta-spec.url", meta["meta-spec"]["url"])
    if "tags" in meta:
        if not isinstance(meta["tags"], list) or not meta["tags"]:
            err("tags: not a non-empty list")
        else:
            for t in meta["tags"]:
                check_term("tags", t)
                if isinstance(t, str) and len(t) > 255:
                    err(f"tags: longer than 255 characters: {t!r}")
    if "no_index" in meta and check_object("no_index", meta["no_index"], {"file", "directory"}):
        for k, v in meta["no_index"].items():
            if not (is_str(v) or (isinstance(v, list) and all(is_str(x) for x in v))):
                err(f"no_index.{k}: not a string or a list of strings")
    if "prereqs" in meta and check_object("prereqs", meta["prereqs"], PHASES):
        for phase, rels in meta["prereqs"].items():
            if not check_object(f"prereqs.{phase}", rels, RELATIONS):
                continue
            for rel, reqs in rels.items():
                if not check_object(f"prereqs.{phase}.{rel}", reqs, set(reqs) if isinstance(reqs, dict) else set()):
                    continue
                for name, rng in reqs.items():
                    check_term(f"prereqs.{phase}.{rel} key", name)
                    check_range(f"prereqs.{phase}.{rel}.{name}", rng)
    if "release_status" in meta and meta["release_status"] not in ("stable", "testing", "unstable"):
        err("release_status: not stable, testing or unstable")
    if "resources" in meta and check_object("resources", meta["resources"], {"homepage", "bugtracker", "repository"}):
        r = meta["resources"]
        if "homepage" in r:
            check_uri("resources.homepage", r["homepage"])
        if "bugtracker" in r and check_object("resources.bugtracker", r["bugtracker"], {"web", "mailto"}):
            if "web" in r["bugtracker"]:
                check_uri("resources.bugtracker.web", r["bugtracker"]["web"])
            if "mailto" in r["bugtracker"] and not re.match(r"^[^@\s]+@[^@\s]+$", str(r["bugtracker"]["mailto"])):
                err("resources.bugtracker.mailto: not an email address")
        if "repository" in r and check_object("resources.repository", r["repository"], {"url", "web", "type"}):
            for k in ("url", "web"):
                if k in r["repository"]:
                    check_uri(f"resources.repository.{k}", r["repository"][k])
            if "type" in r["repository"] and not re.match(r"^[a-z]+$", str(r["repository"]["type"])):
                err("resources.repository.type: not a lower-case word")


def versions(src, meta):
    found = {}
    found["META.json version"] = meta.get("version")
    for ext, p in meta.get("provides", {}).items():
        found[f"META.json provides.{ext}.version"] = p.get("version")
    with open(os.path.join(src, "outbox_pg.control")) as f:
        m = re.search(r"^\s*default_version\s*=\s*'([^']*)'", f.read(), re.M)
    found["outbox_pg.control default_version"] = m and m.group(1)
    with open(os.path.join(src, "debian", "changelog")) as f:
        m = re.match(r"^\S+ \(([^)]*)\)", f.readline())
    # upstream version: without the epoch and the Debian revision
    deb = m and re.sub(r"^[0-9]+:", "", m.group(1)).rsplit("-", 1)[0]
    found["debian/changelog upstream version"] = deb
    if len(set(found.values())) != 1 or None in found.values():
        err("versions disagree: " + ", ".join(f"{k} {v}" for k, v in found.items()))
    # the install script provides names must exist for that version's chain
    script = os.path.join(src, "sql")
    if not any(f.startswith("outbox_pg--") and f.endswith(f"{found['outbox_pg.control default_version']}.sql")
               for f in os.listdir(script)):
        err(f"no sql/ script installs or reaches version {found['outbox_pg.control default_version']}")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("spec", "versions"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    src = sys.argv[2]
    try:
        with open(os.path.join(src, "META.json"), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        print(f"META.json: {e}")
        return 1
    if sys.argv[1] == "spec":
        spec(src, meta)
    else:
        versions(src, meta)
    for e in errors:
        print(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
