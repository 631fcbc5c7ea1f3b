# Lab 4 reference solution, the notebook's form: Megatron's column- and
# row-parallel linear layers (out = inp @ weight.T + bias) and their
# conjugate communication pairs. numpy's math costs no virtual time here.
def column_parallel_forward(dev, out, inp, weight, bias):
    out[:] = inp @ weight.T + bias  # the input is replicated: the identity (copy_to_tp_region)


def column_parallel_backward(dev, dinp, dweight, dbias, dout, inp, weight):
    dweight[:] = dout.T @ inp
    dbias[:] = dout.sum(axis=0)
    dinp[:] = dev.all_reduce(dout @ weight)  # each rank's partial input gradient, summed


def row_parallel_forward(dev, out, inp, weight, bias):
    out[:] = dev.all_reduce(inp @ weight.T) + bias  # partial outputs summed, the bias once


def row_parallel_backward(dev, dinp, dweight, dbias, dout, inp, weight):
    dinp[:] = dout @ weight  # dout is replicated: the identity (reduce_from_tp_region's backward)
    dweight[:] = dout.T @ inp
    dbias[:] = dout.sum(axis=0)
