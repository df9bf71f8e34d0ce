"""`cp-plan check`'s results for CI: JUnit XML (one suite per plan file, one case per expectation) and
GitHub workflow commands (an annotation on the plan's line). They read the results; they decide nothing."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from costmodel.training.check import CheckResult, InvalidPlan

# `cp-plan check --format json`: v1 results and passed; invalid (the files that did not load) is added, empty
# when every file loaded
CHECK_SCHEMA = "cp-plan/check/v1"


def _xml_text(text: str) -> str:
    """``text`` without the characters XML 1.0 forbids (C0 controls but tab, CR, LF; lone surrogates;
    U+FFFE, U+FFFF), each shown as its code point instead, so a plan's name cannot break the report [XML-1.0 §2.2]."""
    return re.sub(
        "[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]", lambda m: f"\\u{ord(m.group()):04x}", text
    )


def junit(results: list[CheckResult]) -> str:
    """JUnit XML: one suite per plan file, one case per expectation."""
    from xml.etree import ElementTree as ET

    x = _xml_text
    suites = ET.Element(
        "testsuites",
        name="cp-plan check",
        tests=str(len(results)),
        failures=str(sum(not r.passed for r in results)),
    )
    by_file: dict[str, list[CheckResult]] = {}
    for r in results:
        by_file.setdefault(r.plan, []).append(r)
    for path, items in by_file.items():
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=x(path),
            tests=str(len(items)),
            failures=str(sum(not r.passed for r in items)),
        )
        for r in items:
            case = ET.SubElement(
                suite, "testcase", classname=x(r.name), name=r.check, file=x(path), line=str(r.line)
            )
            if not r.passed:
                ET.SubElement(case, "failure", message=x(r.detail)).text = x(r.detail)
            else:
                ET.SubElement(case, "system-out").text = x(r.detail)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def junit_problems(error: InvalidPlan) -> str:
    """JUnit XML for plan files that did not load: one erroring case per problem, so a CI reader gets a
    parseable report that names them, never an empty file."""
    from xml.etree import ElementTree as ET

    x = _xml_text
    suites = ET.Element(
        "testsuites", name="cp-plan check", tests=str(len(error.problems)), errors=str(len(error.problems))
    )
    by_file: dict[str, list[tuple[int | None, str]]] = {}
    for path, line, text in error.problems:
        by_file.setdefault(path, []).append((line, text))
    for path, items in by_file.items():
        suite = ET.SubElement(
            suites, "testsuite", name=x(path), tests=str(len(items)), errors=str(len(items))
        )
        for line, text in items:
            where = {"file": x(path)} | ({} if line is None else {"line": str(line)})
            case = ET.SubElement(
                suite, "testcase", classname="cp-plan invalid plan", name="valid plan", **where
            )
            ET.SubElement(case, "error", message=x(text)).text = x(text)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _escape_data(text: str) -> str:
    """A workflow command's message [GH-Commands]."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """A workflow command's property value (file=, title=): ``:`` and ``,`` end it unless escaped."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _annotation(level: str, path: str, line: int | None, title: str, message: str) -> str:
    where = f"file={_escape_property(path)}" + ("" if line is None else f",line={line}")
    return f"::{level} {where},title={_escape_property(title)}::{_escape_data(message)}"


def github(results: list[CheckResult]) -> str:
    """GitHub workflow commands: an error annotation on the failing line, a notice for each pass."""
    lines = [
        _annotation(
            "notice" if r.passed else "error", r.plan, r.line, f"cp-plan {r.check}", f"{r.name}: {r.detail}"
        )
        for r in results
    ]
    return "\n".join(lines) + "\n"


def json_problems(error: InvalidPlan) -> str:
    """The JSON report of plan files that did not load: nothing passed, and every problem named (``invalid``),
    so that a reader of ``> report.json`` finds a document, as junit's and github's readers do."""
    invalid = [{"plan": path, "line": line, "problem": text} for path, line, text in error.problems]
    document = {"schema": CHECK_SCHEMA, "passed": False, "results": [], "invalid": invalid}
    return json.dumps(document, indent=2) + "\n"


def github_problems(error: InvalidPlan) -> str:
    """An error annotation for every problem of invalid plan files, on its line."""
    return "".join(
        _annotation("error", path, line, "cp-plan invalid plan", text) + "\n"
        for path, line, text in error.problems
    )
