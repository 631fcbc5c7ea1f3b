// The MPI process session (transport.h's ProcessSession): MPI's lifetime,
// the non-leaders' silenced output, the exit agreement, and the line a
// process stopped by mpirun during a run shows.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>

#include "runtime/transport_mpi.h"

namespace shardlab {

namespace {

using mpi_transport::check;
using mpi_transport::MpiTransport;
std::unique_ptr<MpiTransport> g_mpi;
MPI_Comm g_exit_comm = MPI_COMM_NULL;  // settle()'s barrier, apart from every other call's
int g_saved_stderr = -1;               // a non-leader's own stderr, behind its log
std::FILE* g_log = nullptr;            // a non-leader's stderr while it runs
std::atomic<bool> g_in_run{false};     // a run is under way (its progress thread runs)
char g_stopped_line[512];              // on_sigterm's line, formatted in advance (set_in_run)
char g_broken_line[512];               // on_sigpipe's, the same loss seen from a broken connection
struct sigaction g_pipe_before {};     // SIGPIPE's handling before this session's

// mpirun ends the job's other processes with SIGTERM when one of them died
// or its host was lost (its own message names which). During a run that is
// a loss: say so in one line, then end as SIGTERM would have.
void on_sigterm(int) {
  if (g_in_run.load())
    (void)!::write(g_saved_stderr >= 0 ? g_saved_stderr : 2, g_stopped_line, std::strlen(g_stopped_line));
  std::signal(SIGTERM, SIG_DFL);
  std::raise(SIGTERM);
}

// A peer process that died (its host lost) can break this process's MPI
// connection to it before mpirun's SIGTERM arrives: OpenMPI's TCP transport
// then writes to a closed socket and the kernel sends SIGPIPE, which would
// end this process with no word ("exited on signal 13", seen under load).
// During a run that is the same loss: say so in one line, then end as
// SIGPIPE would have. Outside a run, SIGPIPE is handled as it was before.
void on_sigpipe(int sig) {
  if (g_in_run.load()) {
    (void)!::write(g_saved_stderr >= 0 ? g_saved_stderr : 2, g_broken_line, std::strlen(g_broken_line));
  } else if (g_pipe_before.sa_handler == SIG_IGN) {
    return;
  } else if (g_pipe_before.sa_handler != SIG_DFL && !(g_pipe_before.sa_flags & SA_SIGINFO)) {
    return g_pipe_before.sa_handler(sig);
  }
  std::signal(SIGPIPE, SIG_DFL);
  std::raise(SIGPIPE);
}

// A non-leader's error lines, from its log to its own stderr, with its number.
void show_errors(int process, int processes) {
  std::fflush(stderr);
  std::rewind(g_log);
  char line[4096];
  const std::string tag = fmt::format("shardlab: error: process {} of {}: ", process, processes);
  while (std::fgets(line, sizeof line, g_log)) {
    std::string text = line;
    const size_t at = text.find("error: ");
    if (at == std::string::npos) continue;
    text = tag + text.substr(at + 7);
    (void)!::write(g_saved_stderr, text.data(), text.size());
  }
}

}  // namespace

void mpi_transport::set_in_run(const std::string* line) {
  if (!line) return g_in_run.store(false);
  *fmt::format_to_n(g_stopped_line, sizeof g_stopped_line - 1, "{}", *line).out = '\0';
  // The same words for a broken connection: "lost a connection" for "stopped by mpirun".
  std::string broken = *line;
  if (const size_t at = broken.find("stopped by mpirun"); at != std::string::npos)
    broken.replace(at, std::strlen("stopped by mpirun"), "lost a connection");
  *fmt::format_to_n(g_broken_line, sizeof g_broken_line - 1, "{}", broken).out = '\0';
  g_in_run.store(true);  // after the line: the handler reads it only while set
}

void mpi_transport::tell_user(const std::string& line) {
  std::fflush(stderr);
  (void)!::write(g_saved_stderr >= 0 ? g_saved_stderr : 2, line.data(), line.size());
}

ProcessSession::ProcessSession(int& argc, char**& argv) {
  // Started by mpirun? OpenMPI and MPICH (Hydra, PMI) both say so in the environment.
  if (!std::getenv("OMPI_COMM_WORLD_SIZE") && !std::getenv("PMI_SIZE") && !std::getenv("PMIX_RANK")) return;
  int provided = 0;
  check(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided), "Init_thread");
  if (provided < MPI_THREAD_SERIALIZED) {
    std::fprintf(stderr, "shardlab: error: this MPI does not support MPI_THREAD_SERIALIZED\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  g_mpi = std::make_unique<MpiTransport>();
  if (g_mpi->processes() == 1) {  // mpirun -np 1: alone, as without mpirun
    g_mpi.reset();
    return;
  }
  set_process_transport(g_mpi.get());
  check(MPI_Comm_dup(MPI_COMM_WORLD, &g_exit_comm), "Comm_dup");
  std::signal(SIGTERM, on_sigterm);
  struct sigaction pipe {};
  pipe.sa_handler = on_sigpipe;
  sigemptyset(&pipe.sa_mask);
  sigaction(SIGPIPE, &pipe, &g_pipe_before);
  // One output: only the leader prints (its error line is every process's:
  // they agree on a run's failure, cluster_share.h). A non-leader's stderr
  // goes to a log that settle() shows if it fails alone.
  if (g_mpi->process() == 0) return;
  g_saved_stderr = ::dup(2);
  g_log = std::tmpfile();
  if (!std::freopen("/dev/null", "w", stdout) || g_saved_stderr < 0 || !g_log || std::fflush(stderr) != 0 ||
      ::dup2(::fileno(g_log), 2) < 0)
    std::abort();
}

int ProcessSession::settle(int code, std::chrono::milliseconds patience) {
  if (g_exit_comm == MPI_COMM_NULL) return code;
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Request req;
  check(MPI_Ibarrier(g_exit_comm, &req), "Ibarrier");
  if (code == 0) {  // done: wait for the others, however long they take
    check(MPI_Wait(&req, MPI_STATUS_IGNORE), "Wait");
    return code;
  }
  const auto deadline = std::chrono::steady_clock::now() + patience;
  for (int done = 0;;) {
    check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "Test");
    if (done) return code;  // every process has ended too
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  int me = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (me != 0) show_errors(me, size);
  MPI_Abort(MPI_COMM_WORLD, code);  // the others wait for this process: end them all
  return code;
}

ProcessSession::~ProcessSession() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return;
  std::fflush(stdout);
  set_process_transport(nullptr);
  g_mpi.reset();
  if (g_exit_comm != MPI_COMM_NULL) MPI_Comm_free(&g_exit_comm);
  MPI_Finalize();
}

}  // namespace shardlab
