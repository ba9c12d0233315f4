import Crypto
import SystemPackage

/// Where a download's bytes live until it finishes, by name in the target's directory: the
/// partial file, the control file and the cursor file beside it.
enum DownloadFiles {
    /// The cursor file's name beside the control file `control`.
    static func cursorName(control: String) -> String {
        String(control.dropLast(SafeFileName.controlSuffix.count)) + SafeFileName.cursorSuffix
    }

    /// Where a request's bytes live until it finishes: the target's directory, the partial file's
    /// and the control file's names in it (`NAME.pickup-part` for `-o NAME`,
    /// `.pickup-HASH.pickup-part` in a directory, named by the URL, until the server has named the file).
    /// Touches nothing on disk.
    static func paths(for request: DownloadRequest) throws(PickupError) -> (directory: FilePath, partial: String, control: String) {
        let directory: FilePath
        let base: String
        switch request.destination {
        case .file(let path):
            guard let name = path.lastComponent?.string, !path.string.hasSuffix("/"), name != ".", name != ".." else {
                throw .invalidInput("output path \(path) has no file name")
            }
            try SafeFileName.checkOutputName(name)
            if FS.isDirectory(path) { throw .fileSystem(path.string, .isDirectory) }
            directory = path.removingLastComponent().isEmpty ? FilePath(".") : path.removingLastComponent()
            base = name
        case .directory(let dir):
            directory = dir
            base = ".pickup-\(Hex.encode(Array(SHA256.hash(data: Array(request.url.utf8)))).prefix(16))"
        }
        if let root = request.root, !directory.lexicallyNormalized().starts(with: root.lexicallyNormalized()) {
            throw .invalidInput("\(directory) is outside the download root \(root)")
        }
        return (directory, base + SafeFileName.partialSuffix, base + SafeFileName.controlSuffix)
    }
}
