import Foundation

extension FileDownload {
    /// This URL answered with a file after all: another URL's partial download at the path
    /// (``RunState/foreign``) goes, said so, before a byte of this one is written or the file finished.
    func discardForeign() {
        guard let why = state.withLockedValue({ $0.foreign }) else { return }
        onEvent(.notice(why))
        ioLock.withLock {
            discardAll()
            state.withLockedValue { $0.foreignDiscarded() }
        }
    }

    /// Whether `head` answers the first request of a download that holds nothing with a Metalink
    /// document that this request follows. Not under the state's lock.
    func answersWithMetalink(_ head: ResponseHead, source: Int) -> Bool {
        guard request.followMetalink, source == 0, Self.isMetalink(head) else { return false }
        return state.withLockedValue { $0.heldBytes == 0 }
    }

    /// `Content-Type: application/metalink4+xml` (parameters and case aside).
    static func isMetalink(_ head: ResponseHead) -> Bool {
        guard let type = head["Content-Type"] else { return false }
        let media = type.split(separator: ";", maxSplits: 1).first.map(String.init) ?? ""
        return media.trimmingCharacters(in: .whitespaces).lowercased() == Metalink.mediaType
    }

    /// Reads the Metalink document at `url` (where the answer came from) into memory, bounded by
    /// ``Metalink/maxBytes``, and parses it. The body of the answer that named it was not read
    /// (a range of it may have been asked for), so it is asked for again, whole.
    func readMetalink(at url: String) async throws -> Metalink {
        let sink = DocumentSink(limit: Metalink.maxBytes)
        let named = "the Metalink document \(DownloadURL.redacted(url))"
        do {
            try await transport.fetch(FetchRequest(url: url, headers: userFields(for: url)), into: sink)
        } catch is DocumentSink.TooLarge {
            throw PickupError.server(status: nil, "\(named) is over \(Metalink.maxBytes >> 20) MiB")
        } catch let e as TransportError {
            throw e.failure
        }
        guard let head = sink.head, head.status == 200, Self.isMetalink(head) else {
            throw PickupError.server(status: sink.head?.status, "\(named) answered \(sink.head?.status ?? 0) when asked again, not the document")
        }
        do {
            return try Metalink.parse(sink.bytes)
        } catch {
            throw PickupError.server(status: nil, "\(named) cannot be used: \(error.description)")
        }
    }
}
