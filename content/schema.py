"""The concept-entry schema: one pydantic model per YAML mapping, unknown keys rejected, types strict.

This module checks each field on its own (types, required keys, URL schemes, id spelling). Rules that
relate fields to each other (a check's science item exists, an answer index is in range, a compute
expression uses only declared variables) live in `content.validate`, which knows the field paths
and lines to report.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, field_validator, model_validator

from content.devices import device_memory

ID_PATTERN = r"^[a-z0-9]+(-[a-z0-9]+)*$"
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

LEVELS = ("foundation", "intermediate", "advanced")
KINDS = ("mechanism", "data-structure", "architecture-variant", "system-technique", "hardware", "component",
         "workload")
SPEC_FORMATS = ("bytes", "number", "times", "percent", "seconds")


def _nonblank(text: str) -> str:
    if not text.strip():
        raise ValueError("expected non-empty text, got blank text")
    return text


# Hosts no entry may cite: they copy or machine-rewrite other people's pages, so a reader cannot tell
# which version of the original they reflect. Cite the paper, official docs, config or code instead.
MIRROR_HOSTS = {
    "mintlify.com": "generated documentation sites built from other projects' repositories",
    "grokipedia.com": "a machine-written encyclopedia without named sources",
    "lzwjava.github.io": "machine-written notes that restate vendor pages",
    "archive-lib.hpctech.co.jp": "a reseller's archived copy of vendor spec sheets",
    "nocrawl.www.anandtech.com": "a crawler-side copy of AnandTech articles, not the publisher's page",
}


def mirror_host(url: str) -> str | None:
    """The deny-listed host `url` is on (the host itself or a subdomain of it), or None."""
    host = (urlsplit(url).hostname or "").lower()
    return next((h for h in MIRROR_HOSTS if host == h or host.endswith("." + h)), None)


def _http_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or any(c.isspace() for c in url):
        raise ValueError(f"expected an http(s) URL, got {url!r}")
    mirror = mirror_host(url)
    if mirror:
        raise ValueError(f"expected the original source, not a page on {mirror} ({MIRROR_HOSTS[mirror]}), "
                         f"got {url!r}")
    return url


def _entry_id(text: str) -> str:
    if not re.fullmatch(ID_PATTERN, text):
        raise ValueError(f"expected a lowercase id of letters, digits and single hyphens (like 'kv-cache'), "
                         f"got {text!r}")
    return text


def _variable_name(text: str) -> str:
    if not re.fullmatch(NAME_PATTERN, text):
        raise ValueError(f"expected a variable name of letters, digits and underscores, got {text!r}")
    return text


Text = Annotated[str, AfterValidator(_nonblank)]
Url = Annotated[str, AfterValidator(_http_url)]
EntryId = Annotated[str, AfterValidator(_entry_id)]
VariableName = Annotated[str, AfterValidator(_variable_name)]
Number = float  # strict mode still accepts whole numbers here; true/false and text are refused
DEVICE_KEY = "device_memory"


def _quantity(value: object) -> float:
    """A typed number, or {device_memory: <device>}: that device's reported bytes from content/devices.yaml."""
    if isinstance(value, dict):
        if list(value) != [DEVICE_KEY]:
            raise ValueError(f"expected a number or {{{DEVICE_KEY}: <device name>}}, got a mapping with keys "
                             f"{', '.join(map(str, value)) or 'none'}")
        return device_memory(value[DEVICE_KEY])
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = "true or false" if isinstance(value, bool) else f"the text {value!r}" if isinstance(value, str) \
            else type(value).__name__
        raise ValueError(f"expected a number or {{{DEVICE_KEY}: <device name>}}, got {kind}")
    return float(value)


# An input value: a number, or a device's memory named from the device table (see content.devices).
Quantity = Annotated[float, PlainValidator(_quantity)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class Source(_Strict):
    title: Text
    url: Url


class SpecCompute(_Strict):
    """A spec value computed by one of the entry's science items from published inputs."""

    science: Text  # title of the science item
    with_: dict[VariableName, Quantity] = Field(alias="with")
    format: Literal[SPEC_FORMATS] = "number"  # bytes: binary units; times: "2.25×"; percent: 0.5 -> "50%";
    # seconds: s, ms or µs
    unit: str = ""  # for "number": the science item's unit or a scaled form of it (GB/s for B/s)


class Spec(_Strict):
    label: Text
    value: Text | None = None  # words only; any number must come from `compute`
    compute: SpecCompute | None = None
    context: Text
    source: Url | None = None  # where the compute inputs are published

    @field_validator("value")
    @classmethod
    def _no_typed_numbers(cls, value: str | None) -> str | None:
        if value is not None and any(c.isdigit() for c in value):
            raise ValueError(f"expected words without digits (a number must come from `compute`), got {value!r}")
        return value

    @model_validator(mode="after")
    def _value_or_compute(self) -> Spec:
        if (self.value is None) == (self.compute is None):
            raise ValueError("expected exactly one of `value` (words) or `compute` (a science item and inputs)")
        return self


class Interface(_Strict):
    name: Text
    direction: Literal["in", "out"]
    signal: Text


class Variable(_Strict):
    """One input of a science item: what it means, and the range a learner can explore it over.

    Either a range (`min`, `max`, `default`, `scale`) or `values` (allowed values) with a `default`; the
    rules that relate these fields (default inside, log scale above zero) live in `content.ranges`.
    """

    meaning: Text
    unit: Text
    min: Number | None = None
    max: Number | None = None
    default: Quantity | None = None  # a number, or {device_memory: <device>} for a capacity
    scale: Literal["linear", "log"] | None = None  # how a slider spaces the range; linear when omitted
    values: list[Number] | None = None  # a small set of allowed values (a dropdown), instead of a range
    integer: bool | None = None  # whole steps; when omitted, true if min, max, default and values are whole


class Science(_Strict):
    title: Text
    equation: Text  # LaTeX, what learners read
    compute: Text  # the same equation as arithmetic over `variables`, what code evaluates
    variables: dict[VariableName, Variable] = Field(min_length=1)
    unit: Text  # unit of the result
    explanation: Text
    assumptions: list[Text] = Field(min_length=1)


class History(_Strict):
    year: int = Field(ge=1900, le=2100)
    title: Text
    significance: Text
    source: Url


class Misconception(_Strict):
    claim: Text  # the wrong belief, as people state it
    correction: Text
    appears_in: Url  # a page where the belief is stated (any page); a pull request only at a commit or file state
    corrected_by: Url  # the primary source that settles it: paper, official docs, official config or code
    shows: Literal["belief", "fix"] = "belief"  # fix: appears_in is where the belief was fixed or refuted,
    # and the card says so


class ChoiceCheck(_Strict):
    kind: Literal["choice"]
    question: Text
    options: list[Text] = Field(min_length=2)
    answer: int  # index into options
    explanation: Text
    feedback: list[Text] | None = None  # one line per option
    # option index -> index into the entry's `misconception` list: the documented belief that wrong option embodies
    beliefs: dict[int, int] = Field(default_factory=dict)


class NumericCheck(_Strict):
    kind: Literal["numeric"]
    question: Text  # may contain {name} placeholders for params
    science: Text  # title of the science item that computes the answer
    params: dict[VariableName, Quantity]
    precision: int = Field(ge=1, le=6)  # significant figures asked for; the rendered question states it
    tolerance: float = Field(gt=0, le=0.5)  # relative; an answer rounded to `precision` is accepted as well
    unit: Text  # unit of the answer; may be a scaled form of the science item's unit (MiB for B)
    explanation: Text


    @property
    def precision_note(self) -> str:
        """The sentence the rendered question ends with."""
        words = ("one", "two", "three", "four", "five", "six")[self.precision - 1]
        return f"Give the answer to {words} significant figure{'s' if self.precision > 1 else ''}."


def round_significant(value: float, figures: int) -> float:
    """`value` rounded to `figures` significant figures (0 stays 0)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, figures - 1 - math.floor(math.log10(abs(value))))


Check = Annotated[ChoiceCheck | NumericCheck, Field(discriminator="kind")]


class Entry(_Strict):
    """One concept card (content/entries/<id>.yaml)."""

    id: EntryId
    level: Literal[LEVELS]
    name: Text
    short_name: Text
    role: Text
    description: Text
    mechanism: list[Text] = Field(min_length=2)
    specs: list[Spec] = Field(min_length=1)
    interfaces: list[Interface] = Field(min_length=1)
    tradeoff: Text
    why_ai: Text
    related: list[EntryId]
    prerequisites: list[EntryId]
    sources: list[Source] = Field(min_length=1)
    scale: Text
    kind: Literal[KINDS]
    misconception: list[Misconception] = Field(min_length=1)
    checks: list[Check] = Field(min_length=3)
    branch: Text
    subbranch: Text
    science: list[Science] = Field(min_length=1)
    history: list[History] = Field(min_length=1)
    learning_objective: Text
    engineering_example: Text
    evidence_notes: Text
    visual_family: EntryId
    lab_id: EntryId | None = None
    scope: Text
    lab_scope: Text | None = None
    investigation_id: EntryId | None = None

    def science_item(self, key: str | int) -> Science:
        """A science item by title or index; ValueError naming the choices otherwise."""
        if isinstance(key, int) and not isinstance(key, bool):
            if 0 <= key < len(self.science):
                return self.science[key]
            raise ValueError(f"science: expected an index from 0 to {len(self.science) - 1}, got {key}")
        for item in self.science:
            if item.title == key:
                return item
        titles = ", ".join(repr(s.title) for s in self.science)
        raise ValueError(f"science: expected one of {titles} in entry {self.id!r}, got {key!r}")


FIELD_NAMES = sorted({name for model in (Entry, Source, SpecCompute, Spec, Interface, Variable, Science, History,
                                         Misconception, ChoiceCheck, NumericCheck)
                      for name in (f.alias or n for n, f in model.model_fields.items())})
