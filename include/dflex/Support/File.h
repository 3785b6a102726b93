//===- File.h - Reading and atomically writing whole files -----------------===//
#ifndef DFLEX_SUPPORT_FILE_H
#define DFLEX_SUPPORT_FILE_H

#include "dflex/Support/Status.h"

#include <string>
#include <string_view>

namespace dflex {

/// Reads a whole file. Errors name the path and the system's reason.
Result<std::string> readFile(const std::string &path);

/// Replaces `path` with `contents` so that readers see either the old file or
/// the complete new one, also across a crash: writes a temporary file in the
/// same directory, fsyncs it, renames it over `path`, then fsyncs the
/// directory. On failure the temporary file is removed and `path` is left as
/// it was. The file gets permissions 0644.
Status writeFileAtomic(const std::string &path, std::string_view contents);

/// Makes the entries of `directory` (created, renamed, removed) durable:
/// fsyncs the directory itself.
Status syncDirectory(const std::string &directory);

/// Creates `path` and missing parents; succeeds if it already is a directory.
Status createDirectories(const std::string &path);

/// The prefix of writeFileAtomic's temporary files for `fileName`, so that
/// directory scans can recognise (and clean up) leftovers of a crashed writer.
std::string atomicTempPrefix(std::string_view fileName);

} // namespace dflex

#endif // DFLEX_SUPPORT_FILE_H
