#ifndef MLASERVE_TESTS_TESTING_ETCD_PROCESS_H_
#define MLASERVE_TESTS_TESTING_ETCD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "cluster/etcd_client.h"
#include "tests/testing/scratch_dir.h"

namespace mlaserve::testing {

// A real etcd (Debian's etcd-server) on loopback ports, its data in a scratch directory
// removed with the object; killed at the latest when the object goes.
class EtcdProcess {
 public:
  // `binary`: the etcd executable. Starts it and waits (up to 30 s) until it answers.
  explicit EtcdProcess(std::string binary);
  ~EtcdProcess();

  // "127.0.0.1:PORT" of its client port.
  std::string endpoint() const;
  std::unique_ptr<cluster::EtcdClient> Client() const;
  // SIGTERM and wait; Start() again serves the same data on the same ports.
  void Stop();
  void Start();

 private:
  std::string binary_;
  ScratchDir dir_{"etcd"};
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

// A loopback TCP port nobody listens on as of now.
int FreeLoopbackPort();

}  // namespace mlaserve::testing

#endif  // MLASERVE_TESTS_TESTING_ETCD_PROCESS_H_
