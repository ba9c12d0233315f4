import Foundation
import SystemPackage

extension FileDownload {
    /// Picks the final path: the name given with `-o`, else the server's suggestion, else the
    /// URL's last segment, else `download`; a free `name (n).ext` when something is already there,
    /// unless overwriting was asked for. A name given with `-o` where another file than this URL's
    /// finished download is (one that appeared since the start, or one whose run waited for the
    /// first answer) stops the download instead: `-o` writes exactly there or nowhere. It looks in
    /// the directory and may say a notice: never under the state's lock. The caller records the
    /// path (``RunState/named(_:replacing:)``) before any byte of the answer is written.
    func targetPath(head: ResponseHead?, _ naming: Naming) throws -> String {
        let raw: String
        if let fixed = fixedName {
            if !request.overwrite, !naming.ours, dir.exists(fixed) { throw PickupError.targetExists(dir.pathOf(fixed).string) }
            raw = fixed
        } else {
            let suggested = head?["Content-Disposition"].flatMap(ContentDisposition.filename).flatMap(SafeFileName.sanitize)
            var fromURL: String? = nil
            for url in [naming.resolved, request.url] where suggested == nil && fromURL == nil {
                fromURL = SafeFileName.rawPath(ofURL: url).flatMap { SafeFileName.fromURLPath(String($0)) }
                    .flatMap(SafeFileName.sanitize)
            }
            raw = suggested ?? fromURL ?? "download"
        }
        return directory.appending(freeName(for: raw)).string
    }

    /// What naming the target needs of the state, taken under its lock: whether a fixed name's
    /// file is this URL's (``RunState/targetIsOurs``), and the URL given after redirects.
    struct Naming {
        let ours: Bool
        let resolved: String
        init(_ state: RunState) {
            ours = state.targetIsOurs
            resolved = state.sources.url(0)
        }
    }

    /// `name`, else the first `name (n).ext` with nothing at it (nor at its partial file's name).
    func freeName(for name: String) -> String {
        if request.overwrite || !dir.exists(name) { return name }
        var n = 1
        while true {
            let candidate = SafeFileName.numbered(name, n)
            if !dir.exists(candidate) && !dir.exists(candidate + SafeFileName.partialSuffix) {
                onEvent(.notice("\(dir.pathOf(name)) already exists; saving as \(candidate)"))
                return candidate
            }
            n += 1
        }
    }

    /// Every byte is held: verify, record, rename into place, clean up. On the blocking-I/O pool,
    /// after any checkpoint in flight: the data is made durable before the rename, so that after a
    /// power loss the final name never holds missing bytes.
    /// `previous`: the finished file a conditional request asked about, when this run fetched
    /// the file again because the server did not confirm it.
    func finish(file: PartialFile, previous: (FilePath, CompletionRecord)? = nil) throws -> (FilePath, Int64, ExpectedDigest?) {
        discardForeign()  // (an empty file, complete without a byte written)
        return try ioLock.withLock { try finishLocked(file: file, previous: previous) }
    }

    private func finishLocked(file: PartialFile, previous: (FilePath, CompletionRecord)?) throws -> (FilePath, Int64, ExpectedDigest?) {
        let (size, naming) = try state.withLockedValue { state throws -> (Int64, Naming?) in
            // (An fsync failed: what is not durable may be gone. Under `ioLock`, no other fsync runs now.)
            if let failed = state.syncFailure { throw failed }
            let size = state.record.totalLength ?? state.heldBytes
            guard state.heldBytes == size else {
                throw PickupError.server(status: nil, "internal: finishing with \(state.heldBytes) of \(size) bytes")
            }
            // A body of no announced length, taken from a lone source: its end must be the length given.
            if let expected = request.length, size != expected {
                throw PickupError.verification("the file is \(size) bytes, the Metalink document says \(expected)")
            }
            return (size, state.record.target == nil ? Naming(state) : nil)
        }
        let target = try naming.map { try targetPath(head: nil, $0) }
        if try file.size() > size { try file.truncate(to: size) }
        try file.sync()
        // Recorded as complete before verifying (a kill then costs a verification, not the
        // bytes), unless no control file was ever needed (it all took less than a checkpoint).
        let (action, rec, checked) = state.withLockedValue { state -> (Checkpoints.Action, ControlRecord, ExpectedDigest?) in
            if let target { state.named(target, replacing: false) }
            return (state.finishing(size: size, verifying: request.checksum != nil || state.record.serverDigest != nil), state.record, state.preVerified)
        }
        try perform(action, file: nil)
        var verified: ExpectedDigest? = nil
        for expected in [request.checksum, rec.serverDigest].compactMap({ $0 }) {
            let actual = expected == checked ? expected.bytes : try file.digest(expected.algorithm)
            guard actual == expected.bytes else {
                throw PickupError.verification(
                    "\(expected.algorithm.rawValue) from \(expected.source) is \(expected.hex) but the file's is \(Hex.encode(actual)); "
                        + "the bytes are kept in \(partialPath) (run with --restart to fetch them again)")
            }
            verified = expected
        }
        // The server did not confirm the finished file (other validators: a load balancer whose
        // servers each have their own ETag, a file touched but not changed) yet sent the same
        // bytes: one copy per version, so the new copy goes and the finished file stays.
        // (A run that resumed such a download after a kill finds that file by its record.)
        let prior = request.overwrite ? nil : previous ?? store.lookup(url: request.url, in: dir, name: fixedName)
        if let (path, old) = prior, old.length == size, let oldName = path.lastComponent?.string, oldName != partialName,
            file.holdsSameBytes(as: oldName, in: dir, length: size)
        {
            onEvent(.notice("the server's validators changed but the bytes did not: \(path) is kept as it is"))
            try? file.truncate(to: 0)
            dir.remove(partialName)
            removeHelpers()
            return (path, size, verified)
        }
        // The target is always a name in this run's directory (a control file from elsewhere
        // cannot point outside it).
        var name = rec.target.flatMap { FilePath($0).lastComponent?.string } ?? "download"
        if (try? DirectoryHandle.check(name)) == nil { name = "download" }
        if SafeFileName.isHelperName(name) { name += "_" }
        // The modification time is final now (neither the attribute nor the rename changes it), so
        // one encoding serves the attribute and the index.
        // The validators a later run asks with: the URL's, else a mirror's (named, to ask it).
        let mirror = rec.validators == nil ? rec.mirrors?.first(where: { $0.rejected == nil && $0.validators != nil }) : nil
        var completion = CompletionRecord(url: request.url, name: name,
                                          validators: rec.validators ?? mirror?.validators, length: size, mtime: FS.mtime(file.fd) ?? 0,
                                          digest: verified,
                                          directory: store.bases.portable(directory))
        completion.source = mirror?.url
        // The finished file is backed up as its folder's other files are (see PartialFile.setExcludedFromBackup).
        file.setExcludedFromBackup(false)
        var encoded = store.attach(completion, to: file)
        while !(try place(as: name)) {
            // Something appeared at the target since we chose it: never replace it. At a name
            // given with `-o`, unless it is this URL's finished download, the run stops (its bytes
            // stay in the partial file: a rerun with --overwrite puts them there).
            if name == fixedName, store.lookup(url: request.url, in: dir, name: name, versions: false) == nil {
                throw PickupError.targetExists(dir.pathOf(name).string)
            }
            name = freeName(for: name)
            completion.name = name
            encoded = store.attach(completion, to: file)
        }
        removeHelpers()
        store.index(encoded, url: completion.url, directory: directory)
        return (dir.pathOf(name), size, verified)
    }

    /// Removes the control file and the cursor file this run has on disk, and makes that durable.
    private func removeHelpers() {
        let (control, cursors) = state.withLockedValue { ($0.onDisk != .nothing, $0.cursorFile != nil) }
        if control { ControlFile.remove(controlName, in: dir) }
        if cursors { dir.remove(cursorName) }
        dir.sync()
    }

    /// Renames the partial file to `name`; false when something appeared there and overwriting is off.
    func place(as name: String) throws(PickupError) -> Bool {
        do { try TestFaults.check(.finish) } catch { throw .fileSystem(dir.pathOf(name).string, error) }
        if request.overwrite {
            try dir.rename(partialName, to: name)
            return true
        }
        do {
            try dir.moveNoReplace(partialName, to: name)
            return true
        } catch {
            if case .targetExists = error { return false }
            throw error
        }
    }
}
