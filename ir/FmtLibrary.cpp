// fmt's compiled part, built here from Debian's own header (fmt/format-inl.h) instead of linking
// libfmt.so: the shared libfmt needs the shared libstdc++, and the rnnc tool links libstdc++
// statically so that a process that finds its kernels in the cache starts sooner (issue 19:
// each shared library is some 0.2-1.7 ms of a VM's process start, libstdc++'s relocations most).
// What the archive holds is what format.h declares for the library to provide: the FMT_FUNC
// functions of format-inl.h (emitted here as ordinary definitions) and the instantiations that
// format.h names `extern template`.
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {

template auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;
template locale_ref::locale_ref(const std::locale& loc);
template auto locale_ref::get<std::locale>() const -> std::locale;
template auto thousands_sep_impl<char>(locale_ref) -> thousands_sep_result<char>;
template auto thousands_sep_impl<wchar_t>(locale_ref) -> thousands_sep_result<wchar_t>;
template auto decimal_point_impl(locale_ref) -> char;
template auto decimal_point_impl(locale_ref) -> wchar_t;

} // namespace detail
FMT_END_NAMESPACE
