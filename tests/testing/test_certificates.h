#ifndef MLASERVE_TESTS_TESTING_TEST_CERTIFICATES_H_
#define MLASERVE_TESTS_TESTING_TEST_CERTIFICATES_H_

#include <string>

#include "absl/status/status.h"
#include "tests/testing/scratch_dir.h"

namespace mlaserve::testing {

// A throw-away PKI made with the openssl command at run time (no key is ever committed), in
// a scratch directory removed with the object: a CA, a server certificate for 127.0.0.1 and
// localhost, a client certificate (subject CN=`client`) that CA signed, and a second,
// unrelated CA. EC P-256 keys, valid for a day.
class TestCertificates {
 public:
  TestCertificates();

  // OK once every file was made; the openssl command's failure otherwise.
  const absl::Status& status() const { return status_; }

  std::string ca() const { return dir_.Path("ca.pem"); }
  std::string server_cert() const { return dir_.Path("server.pem"); }
  std::string server_key() const { return dir_.Path("server.key"); }
  std::string client_cert() const { return dir_.Path("client.pem"); }
  std::string client_key() const { return dir_.Path("client.key"); }
  std::string other_ca() const { return dir_.Path("other-ca.pem"); }
  std::string other_ca_key() const { return dir_.Path("other-ca.key"); }

  // A new server certificate for the same names signed by the other CA, written over
  // server_cert()/server_key() (a renewal, as a certificate manager does it: new files moved
  // into place).
  absl::Status RenewServerCertificateWithOtherCa();

  // Reads a file whole ("" if it cannot be read).
  static std::string Read(const std::string& path);

 private:
  absl::Status Run(const std::string& command) const;
  absl::Status IssueServerCertificate(const std::string& ca_name, const std::string& out_name);

  ScratchDir dir_;
  absl::Status status_;
};

}  // namespace mlaserve::testing

#endif  // MLASERVE_TESTS_TESTING_TEST_CERTIFICATES_H_
