// mpirun's side of bench/launch_latency: MPI_Init + MPI_Barrier, then
// process 0 prints "joined <CLOCK_REALTIME ns>", as bench/launch_rendezvous
// does under dew launch.
// Only MPI's C API: Open MPI's old C++ bindings do not build under -Werror.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <time.h>

#include <cstdio>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Barrier(MPI_COMM_WORLD);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    timespec t{};
    clock_gettime(CLOCK_REALTIME, &t);
    std::printf("joined %lld\n", static_cast<long long>(t.tv_sec) * 1000000000LL + t.tv_nsec);
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
