#ifndef MLASERVE_COMMON_OPENSSL_PTR_H_
#define MLASERVE_COMMON_OPENSSL_PTR_H_

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/x509.h>

#include <memory>
#include <string>

namespace mlaserve {

// OpenSSL objects owned the C++ way, for the code that reads PEM files and PEM text (the
// metrics port's credentials, the load generator's HTTPS scraper).
struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Deleter {
  void operator()(X509* x509) const { X509_free(x509); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;

// A read-only BIO over `pem`, which must outlive it.
inline BioPtr MemoryBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

}  // namespace mlaserve

#endif  // MLASERVE_COMMON_OPENSSL_PTR_H_
