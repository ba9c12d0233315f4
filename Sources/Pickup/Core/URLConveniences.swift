import Foundation
import SystemPackage

// Foundation's `URL` wherever the API takes or gives a path or a download's address, so that an
// app needs neither `FilePath` nor `import SystemPackage` (whose `FilePath` is another type than
// Apple's `System.FilePath`: Pickup does not re-export it, so the name stays unambiguous in an app
// that imports both Pickup and System).

extension FilePath {
    /// The path of a `file:` URL (percent-decoded), or of any URL's path component.
    init(fileURL url: URL) {
        self.init(url.path(percentEncoded: false))
    }

    /// This path as a `file:` URL.
    var fileURL: URL { URL(fileURLWithPath: string) }
}

extension Destination {
    /// Exactly this file (``file(_:)``), from a `file:` URL such as one of `FileManager`'s.
    public static func file(at url: URL) -> Destination { .file(FilePath(fileURL: url)) }
    /// Into this directory (``directory(_:)``), from a `file:` URL such as an app's Documents.
    public static func directory(at url: URL) -> Destination { .directory(FilePath(fileURL: url)) }
}

extension DownloadRequest {
    /// A request for a `URL` (its absolute string); the other parameters as in ``init(url:destination:checksum:overwrite:restart:limiters:connections:root:options:mirrors:pieces:length:)``.
    public init(url: URL, destination: Destination, checksum: ExpectedDigest? = nil, overwrite: Bool = false) {
        self.init(url: url.absoluteString, destination: destination, checksum: checksum, overwrite: overwrite)
    }
}

extension DownloadResult {
    /// The final file as a `file:` URL.
    public var fileURL: URL { path.fileURL }
}

extension DownloadInfo {
    /// The final file as a `file:` URL, once completed.
    public var fileURL: URL? { path?.fileURL }
}

extension DownloadManager.Configuration {
    /// A configuration with its state in the directory of this `file:` URL.
    public init(stateDirectory url: URL) { self.init(stateDirectory: FilePath(fileURL: url)) }
}

extension DownloadManager {
    /// Adds a download of a `URL` (its absolute string): ``add(_:to:priority:checksum:overwrite:speedLimit:paused:options:)``.
    @discardableResult
    public func add(_ url: URL, to destination: Destination, priority: Int = 0, checksum: ExpectedDigest? = nil,
                    overwrite: Bool = false, speedLimit: Int64? = nil, paused: Bool = false,
                    options: RequestOptions = RequestOptions()) throws(PickupError) -> DownloadID
    {
        try add(url.absoluteString, to: destination, priority: priority, checksum: checksum, overwrite: overwrite,
                speedLimit: speedLimit, paused: paused, options: options)
    }
}
