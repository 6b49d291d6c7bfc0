#include "kernels/mla/batch_steps.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mlaserve {
namespace {

// Where a check is, for its error: built only when the check fails (a batch of 128 heads has
// thousands of operands, and their names cost more than the checks).
using Where = absl::FunctionRef<std::string()>;

// Checks one operand: `last` is one past the last element it touches, counted from the
// reference's offset.
class RefChecker {
 public:
  explicit RefChecker(const BatchSteps& steps) : steps_(steps) {}

  absl::Status Check(const BufferRef& ref, ElementType type, int64_t extent, bool written,
                     Where where) const {
    if (ref.buffer < 0 || ref.buffer >= static_cast<int>(steps_.buffers.size())) {
      return absl::InternalError(absl::StrCat(where(), ": buffer ", ref.buffer, " does not exist"));
    }
    const StepBuffer& b = steps_.buffers[ref.buffer];
    if (b.type != type) {
      return absl::InternalError(
          absl::StrCat(where(), ": buffer '", b.name, "' has the wrong element type"));
    }
    if (written && b.kind == StepBuffer::Kind::kInput) {
      return absl::InternalError(absl::StrCat(where(), ": writes input buffer '", b.name, "'"));
    }
    if (ref.offset < 0 || extent < 0 || ref.offset + extent > b.elements) {
      return absl::InternalError(absl::StrCat(where(), ": elements [", ref.offset, ", ",
                                              ref.offset + extent, ") outside buffer '", b.name,
                                              "' of ", b.elements));
    }
    return absl::OkStatus();
  }

 private:
  const BatchSteps& steps_;
};

// One past the last element of `rows` rows of `width`, `stride` apart.
int64_t Extent(int64_t rows, int64_t width, int64_t stride) {
  return rows <= 0 ? 0 : (rows - 1) * stride + width;
}

absl::Status CheckProjection(const RefChecker& c, const ProjectionStep& step, Where where) {
  for (size_t i = 0; i < step.jobs.size(); ++i) {
    const ProjectionJob& j = step.jobs[i];
    const auto at = [&](const char* operand) { return absl::StrCat(where(), " job ", i, operand); };
    if (j.rows <= 0 || j.n <= 0 || j.k <= 0)
      return absl::InternalError(absl::StrCat(at(""), ": empty GEMM"));
    RETURN_IF_ERROR(c.Check(j.a, ElementType::kBf16, Extent(j.rows, j.k, j.lda), false,
                            [&] { return at(" A"); }));
    const int64_t b_extent = j.b_tiles       ? int64_t{j.n} * j.k
                             : j.transpose_b ? Extent(j.n, j.k, j.ldb)
                                             : Extent(j.k, j.n, j.ldb);
    RETURN_IF_ERROR(c.Check(j.b, ElementType::kBf16, b_extent, false, [&] { return at(" B"); }));
    RETURN_IF_ERROR(c.Check(j.c, j.c_bf16 ? ElementType::kBf16 : ElementType::kFp32,
                            Extent(j.rows, j.n, j.ldc), true, [&] { return at(" C"); }));
  }
  return absl::OkStatus();
}

absl::Status CheckAttention(const RefChecker& c, const AttentionStep& step, Where where) {
  if (step.dk <= 0 || step.dv <= 0 || !(step.softmax_scale > 0)) {
    return absl::InternalError(absl::StrCat(where(), ": bad dk, dv or softmax scale"));
  }
  for (size_t i = 0; i < step.groups.size(); ++i) {
    const AttentionRowGroup& g = step.groups[i];
    const auto at = [&](const auto&... more) {
      return absl::StrCat(where(), " row group ", i, more...);
    };
    if (g.rows <= 0 || g.rows > kMaxRowGroupRows || static_cast<int>(g.visible.size()) != g.rows) {
      return absl::InternalError(at(": ", g.rows, " rows, ", g.visible.size(), " visible counts"));
    }
    int64_t length = 0;
    for (int32_t v : g.visible) {
      if (v < 0) return absl::InternalError(at(": negative visible count"));
      length = std::max<int64_t>(length, v);
    }
    RETURN_IF_ERROR(c.Check(g.q, ElementType::kBf16, int64_t{g.rows} * step.dk, false,
                            [&] { return at(" q"); }));
    if (const auto* paged = std::get_if<PagedKeysRef>(&g.keys)) {
      if (paged->page_size <= 0 || paged->width < step.dk || paged->width < step.dv ||
          paged->first_token < 0) {
        return absl::InternalError(at(": bad page geometry"));
      }
      if (length > 0) {
        const int64_t last_page = (paged->first_token + length - 1) / paged->page_size;
        if (last_page >= static_cast<int64_t>(paged->pages.size())) {
          return absl::InternalError(
              at(": ", length, " keys need more than ", paged->pages.size(), " pages"));
        }
        const int64_t page_elements = int64_t{paged->page_size} * paged->width;
        for (int64_t p = paged->first_token / paged->page_size; p <= last_page; ++p) {
          RETURN_IF_ERROR(c.Check(
              BufferRef{paged->pool.buffer, paged->pool.offset + paged->pages[p] * page_elements},
              ElementType::kBf16, page_elements, false, [&] { return at(" page ", p); }));
        }
      }
    } else if (const auto* fp8 = std::get_if<Fp8PagedKeysRef>(&g.keys)) {
      const Fp8PageLayout& layout = fp8->layout;
      if (layout.page_size <= 0 || layout.dl != step.dv || layout.dl + layout.dr != step.dk ||
          layout.dl % 4 != 0 || layout.stride() < layout.page_bytes() || fp8->first_token < 0) {
        return absl::InternalError(at(": bad FP8 page geometry"));
      }
      if (length > 0) {
        const int64_t last_page = (fp8->first_token + length - 1) / layout.page_size;
        if (last_page >= static_cast<int64_t>(fp8->pages.size())) {
          return absl::InternalError(
              at(": ", length, " keys need more than ", fp8->pages.size(), " pages"));
        }
        for (int64_t p = fp8->first_token / layout.page_size; p <= last_page; ++p) {
          RETURN_IF_ERROR(c.Check(
              BufferRef{fp8->pool.buffer, fp8->pool.offset + fp8->pages[p] * layout.stride()},
              ElementType::kByte, layout.page_bytes(), false, [&] { return at(" page ", p); }));
        }
      }
    } else {
      const auto& dense = std::get<DenseKeysRef>(g.keys);
      RETURN_IF_ERROR(c.Check(dense.k, ElementType::kBf16, Extent(length, step.dk, dense.ldk),
                              false, [&] { return at(" K"); }));
      RETURN_IF_ERROR(c.Check(dense.v, ElementType::kBf16, Extent(length, step.dv, dense.ldv),
                              false, [&] { return at(" V"); }));
    }
    RETURN_IF_ERROR(c.Check(g.out, g.out_bf16 ? ElementType::kBf16 : ElementType::kFp32,
                            Extent(g.rows, step.dv, g.out_stride), true,
                            [&] { return at(" out"); }));
    RETURN_IF_ERROR(c.Check(g.lse, ElementType::kFp32, Extent(g.rows, 1, g.lse_stride), true,
                            [&] { return at(" lse"); }));
  }
  return absl::OkStatus();
}

absl::Status CheckCombine(const RefChecker& c, const CombineStep& step, Where where) {
  for (size_t i = 0; i < step.jobs.size(); ++i) {
    const CombineJob& j = step.jobs[i];
    const auto at = [&](const auto&... more) { return absl::StrCat(where(), " job ", i, more...); };
    if (j.parts.empty() || j.rows <= 0 || j.dv <= 0)
      return absl::InternalError(at(": empty merge"));
    for (size_t p = 0; p < j.parts.size(); ++p) {
      RETURN_IF_ERROR(c.Check(j.parts[p].out, ElementType::kFp32, int64_t{j.rows} * j.dv, false,
                              [&] { return at(" part ", p); }));
      RETURN_IF_ERROR(c.Check(j.parts[p].lse, ElementType::kFp32, j.rows, false,
                              [&] { return at(" part ", p, " lse"); }));
    }
    RETURN_IF_ERROR(c.Check(j.out, j.out_bf16 ? ElementType::kBf16 : ElementType::kFp32,
                            Extent(j.rows, j.dv, j.out_stride), true, [&] { return at(" out"); }));
    RETURN_IF_ERROR(c.Check(j.lse, ElementType::kFp32, Extent(j.rows, 1, j.lse_stride), true,
                            [&] { return at(" lse"); }));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckExecutable(const BatchSteps& steps) {
  for (const StepBuffer& b : steps.buffers) {
    if (b.kind == StepBuffer::Kind::kInput && b.input == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("input '", b.name, "' has no memory"));
    }
  }
  for (const StageCopy& copy : steps.staging) {
    if (copy.src == nullptr) return absl::InvalidArgumentError("a query to stage has no memory");
  }
  return absl::OkStatus();
}

void FillStepBuffer(StepBuffer::Fill fill, std::byte* data, int64_t bytes) {
  switch (fill) {
    case StepBuffer::Fill::kNone:
      break;
    case StepBuffer::Fill::kZero:
      std::memset(data, 0, static_cast<size_t>(bytes));
      break;
    case StepBuffer::Fill::kNegInfinity:
      std::fill_n(reinterpret_cast<float*>(data), bytes / 4,
                  -std::numeric_limits<float>::infinity());
      break;
  }
}

void RunStageCopy(const StageCopy& copy, Bf16* dst) {
  for (int r = 0; r < copy.rows; ++r) {
    std::copy_n(copy.src + r * copy.src_stride, copy.width, dst + r * copy.dst_stride);
  }
}

absl::Status ValidateBatchSteps(const BatchSteps& steps) {
  const RefChecker checker(steps);
  for (size_t i = 0; i < steps.staging.size(); ++i) {
    const StageCopy& s = steps.staging[i];
    const auto at = [&] { return absl::StrCat("staging copy ", i); };
    if (s.rows <= 0 || s.width <= 0) return absl::InternalError(absl::StrCat(at(), ": empty"));
    RETURN_IF_ERROR(
        checker.Check(s.dst, ElementType::kBf16, Extent(s.rows, s.width, s.dst_stride), true, at));
  }
  for (size_t i = 0; i < steps.steps.size(); ++i) {
    const BatchStep& step = steps.steps[i];
    if (const auto* p = std::get_if<ProjectionStep>(&step)) {
      RETURN_IF_ERROR(CheckProjection(
          checker, *p, [&] { return absl::StrCat("step ", i, " (", p->name, ")"); }));
    } else if (const auto* a = std::get_if<AttentionStep>(&step)) {
      RETURN_IF_ERROR(CheckAttention(checker, *a,
                                     [&] { return absl::StrCat("step ", i, " (", a->name, ")"); }));
    } else {
      const auto& c = std::get<CombineStep>(step);
      RETURN_IF_ERROR(
          CheckCombine(checker, c, [&] { return absl::StrCat("step ", i, " (", c.name, ")"); }));
    }
  }
  return absl::OkStatus();
}

}  // namespace mlaserve
