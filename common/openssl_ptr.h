#ifndef MLASERVE_COMMON_OPENSSL_PTR_H_
#define MLASERVE_COMMON_OPENSSL_PTR_H_

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/x509.h>

#include <memory>
#include <string>

namespace mlaserve {

// OpenSSL objects owned the C++ way, for the code that reads PEM files and PEM text (the
// metrics port's credentials, the gRPC port's reloading credentials, the load generator's
// HTTPS scraper).
struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Deleter {
  void operator()(X509* x509) const { X509_free(x509); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct X509StoreDeleter {
  void operator()(X509_STORE* store) const { X509_STORE_free(store); }
};
struct X509ChainDeleter {  // frees the certificates too
  void operator()(STACK_OF(X509) * chain) const { sk_X509_pop_free(chain, X509_free); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;
using X509StorePtr = std::unique_ptr<X509_STORE, X509StoreDeleter>;
using X509ChainPtr = std::unique_ptr<STACK_OF(X509), X509ChainDeleter>;

// A read-only BIO over `pem`, which must outlive it.
inline BioPtr MemoryBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

}  // namespace mlaserve

#endif  // MLASERVE_COMMON_OPENSSL_PTR_H_
