"""Unit tests of cgc.runtime.bytecode: the binary encoding of programs and the disassembler."""

from __future__ import annotations

import struct

import pytest

from cgc.machine.program.bytecode import (
    KERNEL_BASE,
    MAGIC,
    NONE,
    PRIMITIVES,
    VERSION,
    Instruction,
    LayerInfo,
    Opcode,
    Program,
    kernel_opcode,
    opcode_name,
)

HEADER = struct.Struct("<4sHHII")
RECORD = struct.Struct("<HHHHII")


def sample_program() -> Program:
    k = kernel_opcode
    instructions = [
        Instruction(Opcode.LAYER, attrs={"layer": 0}, location="fc1"),
        Instruction(Opcode.INPUT, (0,), attrs={"index": 0}),
        Instruction(
            Opcode.WEIGHT, (1,), attrs={"name": "fc1.weight", "perm": [1, 0]}, location="fc1"
        ),
        Instruction(Opcode.CONSTANT, (2,), attrs={"value": [0.5, -1.25]}, location="fc1"),
        Instruction(k("matmul"), (3,), (0, 1), location="fc1"),
        Instruction(k("add"), (4,), (3, 2), location="fc1"),
        Instruction(Opcode.FREE, (), (0, 1, 2, 3)),
        Instruction(Opcode.LAYER, attrs={"layer": 1}, location="head"),
        Instruction(k("relu"), (5,), (4,), location="fc1_relu"),
        Instruction(
            k("reduce_sum"), (6,), (5,), {"axes": [1], "keepdims": False}, location="héad ü"
        ),
        Instruction(Opcode.STREAM_WEIGHT, (7,), attrs={"name": "w"}),
        Instruction(Opcode.STREAM_GRADIENT, (), (5,), {"name": "fc1.weight", "perm": [1, 0]}),
        Instruction(
            Opcode.OPTIMIZER_STEP,
            attrs={"optimizer": "sgd", "config": {"lr": 0.1, "momentum": 0.9}},
        ),
        Instruction(Opcode.OUTPUT, (), (6,), {"index": 0}),
        Instruction(Opcode.FREE, (), (4, 5, 6, 7)),
    ]
    registers = [
        ((4, 8), "float32"),
        ((8, 3), "float32"),
        ((2,), "float32"),
        ((4, 3), "float32"),
        ((4, 3), "float32"),
        ((4, 3), "float32"),
        ((4,), "float32"),
        ((), "float16"),
    ]
    layers = [
        LayerInfo("fc1", (0, 0, 4, 2), ("fc1.weight",)),
        LayerInfo("head", (4, 0, 2, 3), ()),
    ]
    return Program(instructions, registers, layers)


def test_round_trip():
    program = sample_program()
    data = program.encode()
    back = Program.decode(data)
    assert back.instructions == program.instructions
    assert back.registers == program.registers
    assert back.layers == program.layers
    assert back.encode() == data
    # attrs and locations come back as the same plain values
    assert back.instructions[2].attrs == {"name": "fc1.weight", "perm": [1, 0]}
    assert back.instructions[9].location == "héad ü"
    assert back.instructions[1].location is None
    assert back.instructions[4].attrs == {}


def test_encoding_is_canonical():
    program = sample_program()
    reordered = Program(
        [
            Instruction(
                i.opcode, i.results, i.operands, dict(reversed(i.attrs.items())), i.location
            )
            for i in program.instructions
        ],
        list(program.registers),
        list(program.layers),
    )
    assert reordered.encode() == program.encode()


def test_header_and_sharing_of_attrs_and_locations():
    program = sample_program()
    data = program.encode()
    magic, version, zero, table_bytes, count = HEADER.unpack_from(data)
    assert (magic, version, zero, count) == (MAGIC, VERSION, 0, len(program.instructions))
    records = data[HEADER.size + table_bytes :]
    regs = sum(len(i.results) + len(i.operands) for i in program.instructions)
    assert len(records) == RECORD.size * len(program.instructions) + 4 * regs
    # two identical attrs share one table entry; instructions without attrs or location say NONE
    program.instructions.append(Instruction(Opcode.OUTPUT, (), (6,), {"index": 0}))
    data = program.encode()
    _, _, _, table_bytes2, _ = HEADER.unpack_from(data)
    assert table_bytes2 == table_bytes
    first = RECORD.unpack_from(data, HEADER.size + table_bytes2)
    assert first[0] == Opcode.LAYER
    free = program.instructions[6]
    pos = HEADER.size + table_bytes2
    for ins in program.instructions[:6]:
        pos += RECORD.size + 4 * (len(ins.results) + len(ins.operands))
    opcode, nres, nops, _, attrs, loc = RECORD.unpack_from(data, pos)
    assert (opcode, nres, nops, attrs, loc) == (Opcode.FREE, 0, len(free.operands), NONE, NONE)


def test_opcodes_and_mnemonics():
    assert kernel_opcode("neg") == KERNEL_BASE
    for name in PRIMITIVES:
        assert opcode_name(kernel_opcode(name)) == name
        assert Instruction(kernel_opcode(name)).is_kernel
    assert opcode_name(Opcode.STREAM_GRADIENT) == "stream_gradient"
    assert not Instruction(Opcode.FREE).is_kernel
    assert len(set(PRIMITIVES)) == len(PRIMITIVES)


def test_disassemble():
    text = sample_program().disassemble()
    lines = text.splitlines()
    assert text.endswith("\n")
    assert lines[0] == 'layer 0 "fc1" at x=0 y=0 4x2'
    assert 'layer 1 "head" at x=4 y=0 2x3' in lines
    assert '  %3 = matmul %0, %1 : 4x3xfloat32  loc("fc1")' in lines
    assert '  %0 = input {"index":0} : 4x8xfloat32' in lines
    assert '  %6 = reduce_sum %5 {"axes":[1],"keepdims":false} : 4xfloat32  loc("héad ü")' in lines
    assert "  free %0, %1, %2, %3" in lines
    assert "  %7 = stream_weight" in text and ": float16" in text
    assert '  output %6 {"index":0}' in lines
    for mnemonic in ("weight", "constant", "add", "relu", "stream_gradient", "optimizer_step"):
        assert f" {mnemonic}" in text
    assert len(lines) == len(sample_program().instructions)


# --------------------------------------------------------------------------- malformed input


def test_bad_magic():
    data = bytearray(sample_program().encode())
    data[:4] = b"CGBX"
    with pytest.raises(ValueError, match="magic"):
        Program.decode(bytes(data))


def test_wrong_version():
    data = bytearray(sample_program().encode())
    struct.pack_into("<H", data, 4, VERSION + 1)
    with pytest.raises(ValueError, match="version"):
        Program.decode(bytes(data))


def test_trailing_bytes():
    with pytest.raises(ValueError, match="trailing"):
        Program.decode(sample_program().encode() + b"\0")


@pytest.mark.parametrize("keep", [0, 3, HEADER.size - 1, HEADER.size + 5])
def test_truncated_header_or_table(keep):
    with pytest.raises(ValueError):
        Program.decode(sample_program().encode()[:keep])


def _table_end(data: bytes) -> int:
    return HEADER.size + HEADER.unpack_from(data)[3]


@pytest.mark.parametrize("cut", [1, 4, 7, RECORD.size + 4])
def test_truncated_inside_records_raises_value_error(cut):
    data = sample_program().encode()
    assert len(data) - cut > _table_end(data)
    with pytest.raises(ValueError):
        Program.decode(data[:-cut])


def test_register_out_of_range():
    program = sample_program()
    data = bytearray(program.encode())
    pos = _table_end(data)
    for ins in program.instructions[:4]:
        pos += RECORD.size + 4 * (len(ins.results) + len(ins.operands))
    assert RECORD.unpack_from(data, pos)[0] == kernel_opcode("matmul")
    struct.pack_into("<I", data, pos + RECORD.size + 4, len(program.registers))
    with pytest.raises(ValueError, match="register"):
        Program.decode(bytes(data))
    struct.pack_into("<I", data, pos + RECORD.size + 4, len(program.registers) - 1)
    assert Program.decode(bytes(data)).instructions[4].operands == (7, 1)


@pytest.mark.parametrize("field", [4, 5])
def test_attrs_or_location_index_out_of_range(field):
    data = bytearray(sample_program().encode())
    pos = _table_end(data)
    record = list(RECORD.unpack_from(data, pos))
    record[field] = 1000
    RECORD.pack_into(data, pos, *record)
    with pytest.raises(ValueError):
        Program.decode(bytes(data))


def test_empty_program():
    empty = Program([], [], [])
    back = Program.decode(empty.encode())
    assert (back.instructions, back.registers, back.layers) == ([], [], [])
    assert empty.disassemble() == "\n"
