import SystemPackage

#if canImport(Darwin)
import Darwin
import Foundation  // (URLResourceValues)
#endif

/// Whether backups (iCloud, a computer's, Time Machine) take a file: `isExcludedFromBackup`.
/// What a download keeps while it is unfinished (the partial file, its control and cursor files)
/// is excluded: an app's Documents are backed up, and half a film is no use there, nor is the
/// record of it without it. The finished file keeps whatever its folder gives it.
enum BackupExclusion {
    /// Marks the open file `fd` as one backups skip, or not. On Apple platforms only, by the path
    /// the descriptor itself has (`F_GETPATH`, not a name that may have changed since it was
    /// opened); elsewhere nothing. Best effort: a file system without the attribute leaves the
    /// file as it is.
    static func mark(_ fd: FileDescriptor, excluded: Bool) {
        #if canImport(Darwin)
        var buffer = [CChar](repeating: 0, count: Int(MAXPATHLEN))
        guard fcntl(fd.rawValue, F_GETPATH, &buffer) != -1,
            let path = buffer.withUnsafeBufferPointer({ $0.baseAddress.map { String(cString: $0) } })
        else { return }
        var url = URL(fileURLWithPath: path)
        var values = URLResourceValues()
        values.isExcludedFromBackup = excluded
        try? url.setResourceValues(values)
        #else
        _ = (fd, excluded)
        #endif
    }
}
