"""The device table content may name (content/devices.yaml): reported memory and rated capacity per device.

    M: {device_memory: H100 80GB}      # in a spec's `with`, a check's `params` or a variable's `default`

resolves to a `DeviceMemory`, a float of bytes that remembers its device, so that every capacity on a card
comes from the table and none is typed. `typed_capacity` tells the validator when a typed number is a known
device's capacity in disguise (its reported bytes, its MiB read as MB, or its rated GB or GiB).
"""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from content.yamlio import YamlProblem, read_yaml

DEVICES_FILE = Path(__file__).resolve().parent / "devices.yaml"
CAPACITY_TOLERANCE = 0.005  # a typed value this close to a known capacity is that capacity, rounded


class Device(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1)
    reported_mib: int = Field(gt=0)  # nvidia-smi memory.total
    rated_gb: int = Field(gt=0)  # the vendor's round number (decimal GB)
    source: str = Field(min_length=1)

    @property
    def memory_bytes(self) -> int:
        return self.reported_mib * 2**20


class DeviceTable(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    devices: list[Device] = Field(min_length=1)


class DeviceMemory(float):
    """A device's reported memory in bytes, taken from the table by name (`device` says which)."""

    device: str

    def __new__(cls, value: float, device: str):
        obj = super().__new__(cls, value)
        obj.device = device
        return obj

    def __getnewargs__(self) -> tuple[float, str]:
        return float(self), self.device

    def __repr__(self) -> str:
        return f"DeviceMemory({float(self)!r}, device={self.device!r})"


@functools.cache
def devices() -> dict[str, Device]:
    """The table, by device name; ValueError with one line when the file is malformed."""
    try:
        data, _ = read_yaml(DEVICES_FILE)
        table = DeviceTable.model_validate(data)
    except YamlProblem as err:
        raise ValueError(f"{DEVICES_FILE}: {err.field}: {err.message}") from None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{DEVICES_FILE}: {where}: {first['msg']}") from None
    names = [d.name for d in table.devices]
    if len(set(names)) != len(names):
        raise ValueError(f"{DEVICES_FILE}: devices: expected each device name once, got {names}")
    return {d.name: d for d in table.devices}


def device_memory(name: object) -> DeviceMemory:
    """The reported memory of the device called `name`; ValueError naming the known devices otherwise."""
    table = devices()
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"expected one of the devices in content/devices.yaml ({', '.join(table)}), got {name!r}")
    return DeviceMemory(float(table[name].memory_bytes), name)


def typed_capacity(n_bytes: float) -> list[tuple[str, str]]:
    """(device, which capacity) for every known capacity within CAPACITY_TOLERANCE of `n_bytes`."""
    found = []
    for device in devices().values():
        forms = {"reported memory": device.memory_bytes, "reported MiB read as MB": device.reported_mib * 1e6,
                 "rated capacity in GB": device.rated_gb * 1e9, "rated capacity read as GiB": device.rated_gb * 2**30}
        found += [(device.name, form) for form, capacity in forms.items()
                  if abs(n_bytes - capacity) <= CAPACITY_TOLERANCE * capacity]
    return found
