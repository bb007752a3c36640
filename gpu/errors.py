"""The errors every kind's parameters and inputs raise (pencil options and the batch jobs).
gpu/ knows no HTTP: app/errors.py maps each to its status."""

from __future__ import annotations


class ParamError(ValueError):
    """A parameter is missing, has the wrong type, is out of range or not one of its choices.

    `field`: the parameter as a client spells it ("method", "patterns[2]", "model.velocity").
    `code`: the API's error code: invalid_parameter unless a more precise one applies
    (cfl_violation, source_outside_grid, invalid_model, invalid_matrix, not_a_matrix, ...).
    """

    def __init__(self, field: str, message: str, code: str = "invalid_parameter"):
        super().__init__(f"{field}: {message}" if field else message)
        self.field, self.message, self.code = field, message, code


class InputError(ValueError):
    """An input file or a request a job cannot take as a whole: unreadable (empty_file,
    malformed_npy, malformed_safetensors), of a format it does not read
    (unsupported_format), or too large for the limits or the device (too_many_elements,
    grid_too_large, run_too_long, too_large_for_device, text_too_large). `code` is stable;
    `detail` is a sentence for a person."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code, self.detail = code, detail
