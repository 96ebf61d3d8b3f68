"""The diagnosis alone: recorded messages and launcher deaths in, one clear error out (pure)."""

from __future__ import annotations

import signal

from hvd_magic import RankFailedError, RunError, RunTimeout
from hvd_magic.errors import FailureClass
from hvd_magic.launch.processes import death_of
from hvd_magic.launch.spark_plan import cancelled_by_spark, stopped_by_spark
from hvd_magic.protocol import Exit, Message, RankError, Reports, Result, Stall, Started, Waiting
from hvd_magic.run.diagnosis import (
    collective_in,
    explained,
    failure_after_exit,
    left_behind,
    rank_failed,
    run_stopped,
    silent_death,
)
from hvd_magic.run.record import RunRecord, is_consequence
from hvd_magic.run.timeouts import silence_timeout, stall_text, start_timeout

SHUT_DOWN = RankError("vm", "HorovodInternalError", "Horovod has been shut down. This was caused by ...")


def record_of(ranks: int, *messages: tuple[int, object]) -> RunRecord:
    record = RunRecord(ranks)
    for at, (rank, item) in enumerate(messages):
        record.apply(Message(item, rank, b"value" if isinstance(item, Result) else b""), at=float(at))
    return record


def test_the_cause_is_preferred_over_errors_it_caused():
    record = record_of(2, (0, SHUT_DOWN))
    assert record.cause is None and record.first_error is not None and record.first_error.rank == 0
    record.apply(Message(RankError(exc_type="KeyboardInterrupt"), 0), at=1.0)  # our own stop
    assert record.cause is None
    record.apply(Message(RankError("vm", "ValueError", "bad shard"), 1), at=2.0)
    assert record.cause is not None and record.cause.rank == 1 and record.first_error.rank == 1
    # TensorFlow raises its own type with Horovod's message.
    assert is_consequence(RankError(exc_type="UnknownError", message="Horovod has been shut down."))
    assert not is_consequence(RankError(exc_type="ValueError", message="bad shard"))


def test_a_rank_interrupted_before_the_notebook_stopped_the_run_was_killed_from_outside():
    """Our stop interrupts ranks only once the run is decided; a rank's KeyboardInterrupt before
    that came from elsewhere: named so (retried), not a communication error."""
    record = record_of(4, (3, RankError("vm", "KeyboardInterrupt", "", "Traceback ...")))
    error = rank_failed(record, None)
    assert isinstance(error, RankFailedError) and error.failure is FailureClass.KILLED
    assert str(error).startswith(
        "rank 3 on vm failed (killed from outside): KeyboardInterrupt: interrupted (SIGINT) from outside"
    ), str(error)


def test_a_rank_error_is_reported_with_its_host_and_traceback():
    record = record_of(4, (2, RankError("node-b", "ZeroDivisionError", "division by zero", "Traceback ...")))
    error = rank_failed(record, None)
    assert isinstance(error, RankFailedError)
    assert (error.rank, error.host, error.exc_type, error.remote_traceback) == (
        2, "node-b", "ZeroDivisionError", "Traceback ...",
    )  # fmt: skip
    assert str(error).startswith("rank 2 on node-b failed: ZeroDivisionError: division by zero; the other 3")


def test_a_silent_death_is_blamed_rather_than_the_rank_it_took_down():
    record = record_of(2, (0, Started("vm", 1, 0, 2)), (1, Started("vm", 2, 1, 2)), (0, SHUT_DOWN))
    death = silent_death(record, [death_of(1, -9, "vm")])
    assert death is not None and death.rank == 1
    error = rank_failed(record, death)
    assert error.rank == 1 and "killed by signal 9 (SIGKILL)" in str(error)
    assert "rank 0 then failed because of it (HorovodInternalError)" in str(error)


def test_a_death_of_a_rank_that_spoke_is_not_silent():
    record = record_of(2, (1, RankError(exc_type="ValueError")), (0, Exit(1)))
    assert silent_death(record, [death_of(1, 1), death_of(0, 1)]) is None


def test_a_clean_run_has_no_failure():
    record = record_of(
        2, (0, Started("a", 1, 0, 2)), (1, Started("a", 2, 1, 2)), (0, Result()), (0, Exit(0)), (1, Exit(0))
    )
    assert failure_after_exit(record, 0, [], "") is None


def test_what_went_wrong_after_the_launcher_ended_is_said_in_one_error():
    record = record_of(3, (0, Started("a", 1, 0, 3)), (1, Started("a", 2, 1, 3)), (0, Exit(0)))
    error = failure_after_exit(record, 1, [], "mpirun: rank 1 is gone")
    assert isinstance(error, RunError) and not isinstance(error, RankFailedError)
    message = str(error)
    assert "launcher exit code 1" in message and "ranks [2] never started" in message
    assert "ranks [1] died without reporting" in message and "mpirun: rank 1 is gone" in message
    named = failure_after_exit(record, 1, [death_of(1, -9)], "")
    assert (
        named is not None
        and "rank 1 was killed by signal 9" in str(named)
        and "died without" not in str(named)
    )
    no_result = record_of(1, (0, Started("a", 1, 0, 1)), (0, Exit(0)))
    assert "rank 0 finished without sending its result" in str(failure_after_exit(no_result, 0, [], ""))


def test_a_run_spark_cancelled_is_named_as_the_runs_failure_not_as_rank_0s():
    started = [(rank, Started("vm", 10 + rank, rank, 3)) for rank in range(3)]
    ended_by = stopped_by_spark("Job 7 cancelled as part of cancellation of all jobs")
    quiet = failure_after_exit(record_of(3, *started), 1, [], "", ended_by)
    consequence = record_of(3, *started, (2, SHUT_DOWN))  # a rank that saw its peers go, then spoke
    assert explained(consequence, [], ended_by) and not explained(consequence, [])
    spoke = rank_failed(consequence, None, ended_by)
    every_rank_spoke = record_of(3, *started, *[(rank, SHUT_DOWN) for rank in range(3)])
    for error in (quiet, spoke, failure_after_exit(every_rank_spoke, 1, [], "", ended_by)):
        assert isinstance(error, RunError) and not isinstance(error, RankFailedError), error
        assert str(error) == (
            "the run was stopped: Spark cancelled the run's tasks (Job 7 cancelled as part of "
            "cancellation of all jobs); its ranks ended with it"
        )
        assert error.failure is FailureClass.CANCELLED and "rank 0" not in error.cause
    own_error = record_of(3, *started, (1, RankError("vm", "ValueError", "bad")))  # the cause, before
    assert isinstance(rank_failed(own_error, None, ended_by), RankFailedError)


def test_a_spark_session_shut_down_under_the_run_is_not_called_a_cancel_of_the_run():
    word = cancelled_by_spark(
        "org.apache.spark.SparkException: Job 4 cancelled because SparkContext was shut down"
    )
    assert word == "Job 4 cancelled because SparkContext was shut down"
    assert stopped_by_spark(word) == f"its Spark session was shut down while it ran ({word})"
    assert str(run_stopped(stopped_by_spark(word))).startswith(
        "the run was stopped: its Spark session was shut down while it ran"
    )
    assert "the Spark session shut down" in FailureClass.CANCELLED.why_not_retried  # why not retried


def test_a_run_cancelled_before_its_ranks_started_says_so():
    """Cancelled while the barrier stage waited for its slots: no rank had started."""
    ended_by = stopped_by_spark("Job 2 cancelled as part of cancellation of all jobs")
    error = failure_after_exit(record_of(2), 1, [], "", ended_by)
    assert str(error) == f"the run was stopped before its ranks started: {ended_by}"
    assert error.failure is FailureClass.CANCELLED


def test_spark_s_word_for_a_cancel_is_read_from_classic_and_connect_errors():
    classic = "org.apache.spark.SparkException: Job 3 cancelled as part of cancellation of all jobs\n\tat ..."
    connect = (
        "(org.apache.spark.SparkSQLException) [OPERATION_CANCELED] Operation has been canceled. "
        "SQLSTATE: HY008\n\nJVM stacktrace:\norg.apache.spark.SparkSQLException\n\tat ..."
    )
    assert cancelled_by_spark(classic) == "Job 3 cancelled as part of cancellation of all jobs"
    assert cancelled_by_spark(connect) == "OPERATION_CANCELED: Operation has been canceled"
    assert cancelled_by_spark("[TASK_FAILED] Task 0 in stage 1 failed 1 times") is None


def test_errors_recorded_before_the_launcher_ended_win():
    record = record_of(2, (1, RankError("b", "ValueError", "bad")), (0, Result()))
    error = failure_after_exit(record, 0, [], "")
    assert isinstance(error, RankFailedError) and error.rank == 1


def test_time_limits_name_the_ranks():
    record = record_of(3, (0, Started("a", 1, 0, 3)), (1, Started("a", 2, 1, 3)))
    assert isinstance(start_timeout(record, 300), RunTimeout)
    assert "ranks [2] did not start within 300 s (2 of 3 did)" in str(start_timeout(record, 300))
    text = str(silence_timeout(record, 30, now=61.0))
    assert "no rank reported anything for 30 s" in text
    assert "rank 0 for 61 s, rank 1 for 60 s" in text and "Never started: ranks [2]" in text


TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "<horovod cell>", line 4, in <module>\n'
    "    hvd.allreduce(torch.ones(2), name=f't{step}')\n"
    '  File "/venv/lib/python3.11/site-packages/horovod/torch/mpi_ops.py", line 254, in allreduce\n'
    "    summed = HorovodAllreduce.apply(tensor)\n"
    "horovod.common.exceptions.HorovodInternalError: Horovod has been shut down.\n"
)


def test_a_rank_that_finished_while_another_communicated_is_named_as_uneven_work():
    stuck = RankError("vm", "HorovodInternalError", "Horovod has been shut down ...", TRACEBACK)
    record = record_of(3, (0, Exit(0)), (2, Exit(0)), (1, stuck))
    assert explained(record, [])
    error = rank_failed(record, None)
    assert error.rank == 1 and error.remote_traceback == TRACEBACK
    assert "uneven work: ranks 0, 2 finished while rank 1 was still in a collective" in str(error)
    assert "(hvd.allreduce(torch.ones(2), name=f't{step}') at line 4 of the cell)" in str(error)
    assert "hvd.join()" in str(error)
    # Without a finished rank it is no uneven work: the consequence waits for its cause.
    assert not explained(record_of(2, (1, stuck)), [])
    assert "uneven" not in str(rank_failed(record_of(2, (1, stuck)), None))


def test_the_collective_is_found_in_user_code_not_in_horovods():
    assert collective_in(TRACEBACK) == "hvd.allreduce(torch.ones(2), name=f't{step}') at line 4 of the cell"
    commented = TRACEBACK.replace("name=f't{step}')", "name=f't{step}')   # sums the gradients")
    assert collective_in(commented) == "hvd.allreduce(torch.ones(2), name=f't{step}') at line 4 of the cell"
    assert collective_in("no traceback at all") == "a collective"


def test_a_stall_is_described_and_does_not_count_as_progress():
    record = record_of(2, (0, Started("a", 1, 0, 2)), (1, Started("a", 2, 1, 2)))
    assert stall_text(record, now=5.0) == ""
    stall = Stall([0], [["allreduce.t3"]], 15.0)
    record.apply(Message(stall, 0), at=20.0)
    record.apply(Message(stall, 0), at=35.0)  # Horovod repeats it every check: same stall
    assert record.last_message == 1.0  # not progress: timeout= still counts from rank 1's start
    assert (
        stall_text(record, now=68.0)
        == "stalled: rank 0 never submitted allreduce.t3 (rank 1 waiting over 63 s)"
    )
    assert "Horovod says it stalled: rank 0 never submitted allreduce.t3" in str(
        silence_timeout(record, 30, 68.0)
    )
    record.apply(Message(Reports(0), 0), at=70.0)  # the stalled rank moved on
    assert stall_text(record, now=71.0) == ""
    crossed = Stall([0, 1], [["allreduce.b"], ["allreduce.a"]], 15.0)  # each waits for the other's
    record.apply(Message(crossed, 0), at=80.0)
    assert stall_text(record, now=90.0) == (  # "(ranks  waiting ...)", no rank named
        "stalled: rank 0 never submitted allreduce.b; rank 1 never submitted allreduce.a (every rank "
        "waiting over 25 s for a tensor another never submitted: the ranks' calls do not match)"
    )


def test_a_rank_killed_by_a_real_time_signal_is_named():
    """signal.Signals names only the first and last real-time signals: 40 raised ValueError."""
    assert (
        death_of(1, -(signal.SIGRTMIN + 6)).what == f"was killed by signal {signal.SIGRTMIN + 6} (SIGRTMIN+6)"
    )


GLOO_TIMEOUT = RankError(
    "vm", "RuntimeError", "[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 6000ms for recv"
)
PEER_GONE = RankError("vm", "RuntimeError", "[../gloo/transport/tcp/pair.cc:553] Connection closed by peer")


def test_torch_ranks_failing_because_a_peer_is_gone_or_late_are_consequences():
    assert is_consequence(GLOO_TIMEOUT) and is_consequence(PEER_GONE)
    assert is_consequence(RankError("vm", "DistStoreError", "Timed out after 7 seconds waiting for clients."))
    assert not is_consequence(RankError("vm", "RuntimeError", "CUDA out of memory"))


def test_the_rank_not_waiting_when_the_others_timed_out_is_behind():
    waiting = Waiting("all_reduce", "line 5 of the cell", 3.0)
    started = [(rank, Started(f"h{rank}", rank, rank, 3)) for rank in range(3)]
    record = record_of(3, *started, (0, waiting), (2, waiting), (0, GLOO_TIMEOUT))
    assert explained(record, [])  # no grace needed: the waits say who was behind
    error = rank_failed(record, None)
    assert (error.rank, error.host) == (1, "h1")
    assert str(error).startswith(
        "rank 1 on h1 failed: it was behind; rank 0 timed out waiting for it in all_reduce "
        "(line 5 of the cell): RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:78] Timed out"
    )
    # Without waits (or with every rank waiting) nobody can be named: the error stands as it is.
    assert left_behind(record_of(2, (0, GLOO_TIMEOUT))) is None
    assert left_behind(record_of(2, (0, waiting), (1, waiting), (0, GLOO_TIMEOUT))) is None
    # A rank waiting in another call (still importing, say) is as far behind as one not waiting.
    elsewhere = Waiting("barrier", "line 9 of the cell", 3.0)
    assert left_behind(record_of(2, (0, waiting), (1, elsewhere), (0, GLOO_TIMEOUT))).rank == 1
    # A wait that ended is no longer a wait.
    assert record_of(2, (0, waiting), (0, Waiting())).waits == {}
    # Rank 1's wait in the call just ended (its own timeout on its way), rank 2 was elsewhere:
    # rank 2 is behind, not rank 1
    four = [(rank, Started(f"h{rank}", rank, rank, 4)) for rank in range(4)]
    ended = record_of(4, *four, (0, waiting), (1, waiting), (2, elsewhere), (1, Waiting()), (0, GLOO_TIMEOUT))
    assert ended.waits.keys() == {0, 2} and left_behind(ended).rank == 2


def test_a_timed_out_call_is_named_however_the_end_of_its_wait_is_folded_in():
    """A call that fails ends its wait. The rank's watch may say so before or after the rank
    reports the failure, and the rank's exit may be folded in before the run judges the error
    (the engine takes queued messages in batches: a loaded full run blamed rank 0 so). Property:
    every order the rank can send them in, judged after any number of them past the error."""
    waiting = Waiting("init_process_group", "line 4 of the cell", 3.0)
    started = [(rank, Started(f"h{rank}", rank, rank, 2)) for rank in range(2)]
    timeout = RankError(
        "vm", "DistStoreError", "Timed out after 16 seconds waiting for clients. 1/2 clients joined."
    )
    orders = (
        [(0, timeout), (0, Waiting()), (0, Exit(1))],
        [(0, Waiting()), (0, timeout), (0, Exit(1))],
        [(0, timeout), (0, Exit(1))],  # the watch stopped before it saw the end
    )
    for order in orders:
        for judged in range(next(i for i, m in enumerate(order) if m[1] is timeout) + 1, len(order) + 1):
            error = rank_failed(record_of(2, *started, (0, waiting), *order[:judged]), None)
            assert str(error).startswith(
                "rank 1 on h1 failed: it was behind; rank 0 timed out waiting for it in init_process_group"
            ), order[:judged]
    # once the rank has moved on (it reported steps), the wait that ended is not its cause
    moved_on = record_of(2, *started, (0, waiting), (0, Waiting()), (0, Reports()), (0, timeout))
    assert left_behind(moved_on) is None
