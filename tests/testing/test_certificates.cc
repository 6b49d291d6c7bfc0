#include "tests/testing/test_certificates.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace mlaserve::testing {
namespace {

constexpr char kKey[] = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";

}  // namespace

TestCertificates::TestCertificates() : dir_("tls") {
  const std::string d = dir_.Path("");
  status_ = Run(absl::StrCat("openssl req -x509 ", kKey, " -days 1 -subj /CN=mlaserve-test-ca",
                             " -keyout ", d, "ca.key -out ", d, "ca.pem"));
  if (status_.ok()) {
    status_ = Run(absl::StrCat("openssl req -x509 ", kKey, " -days 1 -subj /CN=other-ca",
                               " -keyout ", d, "other-ca.key -out ", d, "other-ca.pem"));
  }
  if (status_.ok()) status_ = IssueServerCertificate("ca", "server");
  if (status_.ok()) {
    status_ = Run(absl::StrCat("openssl req ", kKey, " -subj /CN=client -keyout ", d,
                               "client.key -out ", d, "client.csr && openssl x509 -req -in ", d,
                               "client.csr -CA ", d, "ca.pem -CAkey ", d,
                               "ca.key -CAcreateserial -days 1 -out ", d, "client.pem"));
  }
}

absl::Status TestCertificates::IssueServerCertificate(const std::string& ca_name,
                                                      const std::string& out_name) {
  const std::string d = dir_.Path("");
  const std::string ext = d + "server.ext";
  std::ofstream(ext) << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
  // Written beside the live files, then renamed over them: a reader never sees half a file.
  const std::string tmp = d + out_name + ".new";
  absl::Status made = Run(absl::StrCat(
      "openssl req ", kKey, " -subj /CN=localhost -keyout ", tmp, ".key -out ", tmp,
      ".csr && openssl x509 -req -in ", tmp, ".csr -CA ", d, ca_name, ".pem -CAkey ", d, ca_name,
      ".key -CAcreateserial -days 1 -extfile ", ext, " -out ", tmp, ".pem"));
  if (!made.ok()) return made;
  std::error_code error;
  std::filesystem::rename(tmp + ".key", d + out_name + ".key", error);
  if (!error) std::filesystem::rename(tmp + ".pem", d + out_name + ".pem", error);
  if (error) return absl::InternalError(absl::StrCat("renaming certificates: ", error.message()));
  return absl::OkStatus();
}

absl::Status TestCertificates::RenewServerCertificateWithOtherCa() {
  return IssueServerCertificate("other-ca", "server");
}

absl::Status TestCertificates::Run(const std::string& command) const {
  const std::string logged = absl::StrCat("(", command, ") >", dir_.Path("openssl.log"), " 2>&1");
  if (std::system(logged.c_str()) == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("openssl failed: ", command, ": ", Read(dir_.Path("openssl.log"))));
}

std::string TestCertificates::Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

}  // namespace mlaserve::testing
