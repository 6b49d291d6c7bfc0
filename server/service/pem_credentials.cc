#include "server/service/pem_credentials.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/openssl_ptr.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace mlaserve::service {
namespace {

absl::Status BadFile(absl::string_view flag, absl::string_view path, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, ": ", problem));
}

absl::StatusOr<std::string> ReadFile(absl::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return BadFile(flag, path, "cannot be read");
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// Every certificate of a PEM text, in file order.
std::vector<X509Ptr> Certificates(const std::string& pem) {
  BioPtr bio = MemoryBio(pem);
  std::vector<X509Ptr> certs;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(cert);
  }
  ERR_clear_error();  // the end of the text reads as an error
  return certs;
}

}  // namespace

struct PemCredentials::Loaded {
  std::string cert_pem, key_pem, ca_pem;  // what was parsed, to tell a renewal from no change
  X509Ptr leaf;
  X509ChainPtr chain;  // the intermediates after the leaf
  KeyPtr key;
  X509StorePtr client_ca;  // null unless mutual TLS
};

namespace {

absl::StatusOr<std::shared_ptr<const PemCredentials::Loaded>> Parse(const TlsOptions& tls) {
  auto loaded = std::make_shared<PemCredentials::Loaded>();
  ASSIGN_OR_RETURN(loaded->cert_pem, ReadFile("tls_cert", tls.cert_file));
  std::vector<X509Ptr> certs = Certificates(loaded->cert_pem);
  if (certs.empty()) return BadFile("tls_cert", tls.cert_file, "holds no PEM certificate");
  loaded->leaf = std::move(certs.front());
  loaded->chain.reset(sk_X509_new_null());
  for (size_t i = 1; i < certs.size(); ++i) sk_X509_push(loaded->chain.get(), certs[i].release());

  ASSIGN_OR_RETURN(loaded->key_pem, ReadFile("tls_key", tls.key_file));
  BioPtr key_bio = MemoryBio(loaded->key_pem);
  loaded->key.reset(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (loaded->key == nullptr) {
    return BadFile("tls_key", tls.key_file, "holds no PEM private key (or it is encrypted)");
  }
  if (X509_check_private_key(loaded->leaf.get(), loaded->key.get()) != 1) {
    ERR_clear_error();
    return BadFile("tls_key", tls.key_file,
                   absl::StrCat("is not the private key of --tls_cert ", tls.cert_file));
  }
  if (!tls.client_ca_file.empty()) {
    ASSIGN_OR_RETURN(loaded->ca_pem, ReadFile("tls_client_ca", tls.client_ca_file));
    std::vector<X509Ptr> cas = Certificates(loaded->ca_pem);
    if (cas.empty())
      return BadFile("tls_client_ca", tls.client_ca_file, "holds no PEM certificate");
    loaded->client_ca.reset(X509_STORE_new());
    for (const X509Ptr& ca : cas) X509_STORE_add_cert(loaded->client_ca.get(), ca.get());
  }
  return std::shared_ptr<const PemCredentials::Loaded>(std::move(loaded));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PemCredentials>> PemCredentials::Load(const TlsOptions& tls) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Loaded> loaded, Parse(tls));
  return std::unique_ptr<PemCredentials>(new PemCredentials(tls, std::move(loaded)));
}

PemCredentials::PemCredentials(const TlsOptions& tls, std::shared_ptr<const Loaded> loaded)
    : tls_(tls), loaded_(std::move(loaded)), next_check_(absl::Now() + tls.reload_interval) {}

PemCredentials::~PemCredentials() = default;

std::shared_ptr<const PemCredentials::Loaded> PemCredentials::Current() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now < next_check_) return loaded_;
  next_check_ = now + tls_.reload_interval;
  absl::StatusOr<std::shared_ptr<const Loaded>> reread = Parse(tls_);
  if (!reread.ok()) {
    spdlog::warn("metrics TLS: keeping the previous certificate: {}",
                 std::string(reread.status().message()));
  } else if ((*reread)->cert_pem != loaded_->cert_pem || (*reread)->key_pem != loaded_->key_pem ||
             (*reread)->ca_pem != loaded_->ca_pem) {
    spdlog::info("metrics TLS: serving the renewed files of {}", tls_.cert_file);
    loaded_ = *std::move(reread);
  }
  return loaded_;
}

bool PemCredentials::InstallOn(SSL* ssl) {
  const std::shared_ptr<const Loaded> loaded = Current();
  if (SSL_use_certificate(ssl, loaded->leaf.get()) != 1 ||
      SSL_use_PrivateKey(ssl, loaded->key.get()) != 1 ||
      SSL_set1_chain(ssl, loaded->chain.get()) != 1) {
    ERR_clear_error();
    return false;
  }
  if (loaded->client_ca != nullptr &&
      SSL_set1_verify_cert_store(ssl, loaded->client_ca.get()) != 1) {
    ERR_clear_error();
    return false;
  }
  return true;
}

}  // namespace mlaserve::service
