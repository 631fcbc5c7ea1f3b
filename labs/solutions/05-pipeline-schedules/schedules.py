# Lab 5 reference solution, the notebook's form: GPipe and 1F1B as schedules-as-data.
def gpipe(pp, micro_batches):
    schedule = []
    for rank in range(pp):
        out = []
        for mb in range(micro_batches):
            out += forward_actions(pp, rank, mb)
        for mb in range(micro_batches):
            out += backward_actions(pp, rank, mb)
        schedule.append(out)
    return schedule


def one_f_one_b(pp, micro_batches):
    schedule = []
    for rank in range(pp):
        out = []
        warmup = min(pp - rank - 1, micro_batches)
        forwards = backwards = 0
        while forwards < warmup:
            out += forward_actions(pp, rank, forwards)
            forwards += 1
        while forwards < micro_batches:  # steady: one forward, one backward
            out += forward_actions(pp, rank, forwards)
            out += backward_actions(pp, rank, backwards)
            forwards += 1
            backwards += 1
        while backwards < micro_batches:  # cool-down
            out += backward_actions(pp, rank, backwards)
            backwards += 1
        schedule.append(out)
    return schedule
