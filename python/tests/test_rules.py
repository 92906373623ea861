"""Every registered op's rule asked from Python answers as `shardwise infer` does, and reshard plans
print as `shardwise plan-reshard` prints them. The op list and the cases come from the C++ registry."""
import re
import subprocess

import pytest

import shardwise as sw

LINE = re.compile(r"^  (input|output|grad) (\d+): \S+ \S+ \[(.*)\]$")
MESHES = ["2,2", "3"]


def cli_answer(bin_path, op, mesh, case, placements, part):
    args = [bin_path, "infer", op, "--mesh", mesh,
            "--shapes", ",".join("x".join(map(str, s)) if s else "scalar" for s in case["shapes"]),
            "--dtypes", ",".join(case["dtypes"]), "--placements", ";".join(placements), "--part", part]
    if case["attrs_text"]:
        args += ["--attrs", case["attrs_text"]]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        return ("error", p.stderr.strip().removeprefix("shardwise: error: "))
    ins, outs = [], []
    for line in p.stdout.splitlines():
        m = LINE.match(line)
        if m:
            (ins if m.group(1) == "input" else outs).append(m.group(3))
    return (ins, outs)


def py_answer(op, mesh, case, placements, part):
    try:
        a = sw.infer(op, mesh, case["shapes"], placements, case["attrs"], part=part, dtypes=case["dtypes"])
    except sw.Error as e:
        return ("error", str(e))
    return ([str(p) for p in a.inputs], [str(p) for p in a.outputs])


def variants(case, mesh_ndim):
    """All replicated; every input's first dim sharded on mesh dim 0; its last dim on the last mesh dim."""
    yield [",".join(["R"] * mesh_ndim) for _ in case["shapes"]]
    for first, mesh_dim in ((True, 0), (False, mesh_ndim - 1)):
        lists = []
        for shape in case["shapes"]:
            p = ["R"] * mesh_ndim
            if len(shape) > 0:
                p[mesh_dim] = f"S({0 if first else len(shape) - 1})"
            lists.append(",".join(p))
        yield lists


def test_every_registered_op_is_listed_with_a_case():
    ops = sw.ops()
    assert len(ops) > 50
    assert len({o.name for o in ops}) == len(ops)
    assert all(o.cases for o in ops), [o.name for o in ops if not o.cases]
    matmul = next(o for o in ops if o.name == "matmul")
    assert matmul.num_inputs == 2 and matmul.has_grad and matmul.family


@pytest.mark.parametrize("mesh", MESHES)
def test_every_rule_answers_as_the_cli_does(shardwise_bin, mesh):
    compared = errors = 0
    mesh_ndim = len(mesh.split(","))
    for op in sw.ops():
        case = op.cases[0]
        for placements in variants(case, mesh_ndim):
            fwd = py_answer(op.name, mesh, case, placements, "forward")
            assert fwd == cli_answer(shardwise_bin, op.name, mesh, case, placements, "forward"), (op.name, placements)
            compared += 1
            if fwd[0] == "error":
                errors += 1
                continue
            rev = py_answer(op.name, mesh, case, fwd[1], "reverse")
            assert rev == cli_answer(shardwise_bin, op.name, mesh, case, fwd[1], "reverse"), (op.name, fwd[1])
            compared += 1
            if op.has_grad:
                grad_in = placements + fwd[1]
                got = py_answer(op.name, mesh, case, grad_in, "grad")
                assert got == cli_answer(shardwise_bin, op.name, mesh, case, grad_in, "grad"), (op.name, grad_in)
                compared += 1
    assert errors < compared / 4, f"{errors} of {compared} questions were errors: the variants test too little"


def test_infer_returns_objects():
    a = sw.infer("matmul", sw.Mesh({"dp": 2, "tp": 2}), [(8, 16), (16, 4)],
                 [[sw.Shard(0), sw.Shard(1)], [sw.Replicate(), sw.Replicate()]])
    assert a.op == "matmul" and a.part == "forward" and a.rule
    assert a.inputs[0] == [sw.Shard(0), sw.Shard(1)]
    assert a.inputs[1] == [sw.Replicate(), sw.Shard(0)]
    assert a.outputs[0] == [sw.Shard(0), sw.Partial("sum")]


def test_infer_errors_name_the_op_and_the_count():
    with pytest.raises(sw.UsageError, match="matmull.*matmul"):
        sw.infer("matmull", [2], [(4, 4), (4, 4)], ["R", "R"])
    with pytest.raises(sw.UsageError, match="1 placements for 2 inputs"):
        sw.infer("matmul", [2], [(4, 4), (4, 4)], ["R"])


PLANS = [
    ("8x12", "2,2", "S(0),S(1)", "R,R", None),
    ("8x12", "2,2", "P(sum),R", "S(1),R", None),
    ("7x5", "4", "S(0)", "S(1)", None),
    ("8x12", "2,2", "S(0),R", "S(1)", "4"),
]


@pytest.mark.parametrize("shape,mesh,src,dst,dst_mesh", PLANS)
def test_reshard_plans_print_as_the_cli_prints_them(cli, shape, mesh, src, dst, dst_mesh):
    to_mesh = dst_mesh or mesh
    ranks = "" if dst_mesh is None else " ranks=4-7"
    want = cli("plan-reshard", "--shape", shape, "--from", f"mesh={mesh} {src}", "--to", f"mesh={to_mesh}{ranks} {dst}")
    dst_m = None if dst_mesh is None else sw.Mesh([int(dst_mesh)], process_ids=[4, 5, 6, 7])
    plan = sw.plan_reshard(shape, mesh, src, dst, dst_mesh=dst_m)
    assert str(plan) == want
    assert all(isinstance(s.kind, str) and s.cost_s >= 0 for s in plan.steps)
