// Every timing of Dew's failure handling in one place, each with the race it
// bounds. The pool's defaults can be changed per run (DEW_*_SECONDS,
// JoinOptions); the rest are fixed. See docs/design/ and
// docs/guide/failures.md for the whole path.
#pragma once

#include <chrono>

namespace dew::timings {

using namespace std::chrono_literals;

// --- the pool (pool/): defaults of its Settings --------------------------
// A rank that arrives first at a host agreement waits for one still busy
// with host work (a checkpoint upload): the wait a stalled rank can cost.
inline constexpr std::chrono::milliseconds kAgreementPatience = 24h;
// A process (or its link) that goes silent is declared failed after this:
// bounds the hang of a pool whose peer froze or whose network was cut.
inline constexpr std::chrono::milliseconds kHeartbeatTimeout = 10s;
// A process that heard of a failure while inside a device collective (which
// no backend times out) ends itself this long after, not at an agreement.
inline constexpr std::chrono::milliseconds kFailureGrace = 60s;
// Peers that never come: a join gives up after this.
inline constexpr std::chrono::milliseconds kJoinTimeout = 300s;
// An agreement or gather still waiting after this, a join still incomplete,
// is said in one line naming whom it waits for (again at twice, four times
// ... this wait): a slow peer or link is seen long before any patience ends.
inline constexpr std::chrono::milliseconds kSlowAfter = 30s;
// A connection to process 0's service that does not prove the secret is
// closed after this: strangers cannot hold its descriptors for ever.
inline constexpr std::chrono::milliseconds kHandshakeTimeout = 10s;

// --- a failing process (pool/failure.cpp) ---------------------------------
// It waits this long for its failure to leave (and, on process 0, for the
// service to push it to every peer) before it exits: otherwise its exit can
// reach a launcher before the cause does, and the wrong rank is blamed.
inline constexpr std::chrono::milliseconds kFailureFlush = 1s;
// From a fatal signal's handler: time for the prepared failure frame to leave
// before the process dies (process 0 also pushes it to every peer).
inline constexpr std::chrono::milliseconds kSignalFrameLeaves = 100ms;
inline constexpr std::chrono::milliseconds kSignalFramePushed = 300ms;
// Processes that find the same peers late at an agreement wait this long for
// process 0's word, so the late process is named once, not every waiter.
inline constexpr std::chrono::milliseconds kLateWordWait = 1s;
// A process stopped from outside (SIGTERM: scancel, preemption) tells its
// peers before it unwinds: process 0 waits this long for its service to
// push the notice (its service ends with it). Slurm's KillWait (30 s by default) bounds the
// whole unwinding.
inline constexpr std::chrono::milliseconds kStopNoticeFlush = 300ms;
// A program ending with a failure of its own (Python's sys.exit(3)) says so
// to its peers first and goes on with its exit, which this bounds: the
// peers end at once, and a launcher waits only a moment (dew launch: half
// its stop grace) for the process they named before stopping it.
inline constexpr std::chrono::milliseconds kAnnouncedExitBound = 250ms;
// A step over its StepWatchdog bound: the processes whose bounds passed
// wait this long for each other's step reports (all begin a step at about
// the same moment, so theirs pass together); one that has given none by
// then is behind. Those that named another wait as long again for its own
// word (its exit code 124) before naming it for it.
inline constexpr std::chrono::milliseconds kStallReportWait = 2s;
inline constexpr std::chrono::milliseconds kStallWordWait = 2s;
// A device whose collective broke waits for the pool's word of the peer that
// failed before failing the pool itself (the rehearsal, train/; Python's
// excepthook for an error raised inside a collective): the peer that caused
// it is named, not the device that noticed. The wait ends the moment the word
// comes (Pool::wait_until_ending); this bounds it when no word comes, i.e.
// when the broken collective was this process's own failure after all.
inline constexpr std::chrono::milliseconds kPeerNoticeGrace = 2s;

// A process that ends for its own failure or a peer's gives the program's own
// before-exit hook (set_before_exit: Python's streams, logging handlers and
// open files, its finally: blocks and atexit) this long; then it ends hard,
// so nothing (jax.distributed's shutdown barrier, a finally: blocked in C
// code) can hold it longer. DEW_EXIT_BOUND_SECONDS sets another.
inline constexpr std::chrono::milliseconds kBeforeExitBound = 2s;

// --- the SPANK plugin (spank/) --------------------------------------------
// How it ends a step: SIGTERM to every task, SIGKILL this much later to any
// that caught it.
inline constexpr std::chrono::milliseconds kStepKillGrace = 2s;
// srun, which waits for every task, sends the step SIGKILL this long after a
// node's notice that it ended the step, if srun still waits then: the
// node's own SIGKILL dies with its slurmstepd when its last task ends, and
// a task that started after the step's end reached its node (a launch race
// for a rank that fails in the step's first ~200 ms) got no signal at all.
inline constexpr std::chrono::milliseconds kSrunStepKillAfter = kStepKillGrace + 1s;
// A node whose notice srun did not take prints the failure's line itself
// and then pauses this long before it ends the step: slurmstepd's I/O
// thread forwards the line to srun, and the step's end tears that I/O down;
// Slurm gives no acknowledgement of a forwarded line. Without the pause 4
// lines in 10 were lost; with 100 ms none in 30. A bound, not an order, and
// the fallback only: the usual way, the notice to srun's verdict listener,
// is acknowledged by srun before the node ends the step.
inline constexpr std::chrono::milliseconds kNodeLinePause = 100ms;
// A node that saw only peers' exit 75 waits this long for the failing rank's
// own exit to end the step (and name it) before ending the step itself (a
// frozen or lost rank).
inline constexpr std::chrono::milliseconds kPeerGrace = 1s;

// srun's plugin names a pool step's failure once for every node: after the
// first node's notice of a failed rank it waits this long for other nodes'
// notices, then names the earliest (by each node's clock).
inline constexpr std::chrono::milliseconds kVerdictSettle = 300ms;
// A node's slurmstepd waits this long for srun to take its notice before it
// names the failure itself (srun gone, or unreachable from the node).
inline constexpr std::chrono::milliseconds kNoticeBound = 500ms;

// srun's plugin asks slurmctld this often whether the step it waits for
// still exists: a node whose link was down when its tasks ended never sends
// srun their exits, and srun would wait for ever for a step Slurm has ended.
inline constexpr std::chrono::milliseconds kSrunWatchEvery = 5s;
// Looks in a row that must find the step gone before srun is ended: one
// alone can fall between the step's end and srun's own, ordinary one.
inline constexpr int kSrunWatchGoneLooks = 2;

// --- dew launch (cli/, launch/) -------------------------------------------
// A stopped local or ssh process has this long between SIGTERM and SIGKILL.
inline constexpr std::chrono::milliseconds kLaunchStopGrace = 1s;
// srun, stopped by dew launch --slurm, has this long to end its step itself.
inline constexpr std::chrono::milliseconds kSrunStopGrace = 10s;

}  // namespace dew::timings
