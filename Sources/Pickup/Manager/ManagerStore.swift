import Foundation
import GRDB
import NIOConcurrencyHelpers
import SystemPackage

/// One row of the `download` table: a download's identity, options and state. Byte-level
/// progress lives in the engine's control files; `bytesDone`/`totalBytes` here are what was last
/// seen, for display before the control file is read.
struct DownloadRow: Codable, FetchableRecord, MutablePersistableRecord, Sendable {
    static let databaseTableName = "download"

    var id: Int64?
    var url: String
    var destinationKind: String
    var destinationPath: String
    var priority: Int
    var place: Int64
    var state: String
    var checksum: String?
    var overwrite: Bool
    var speedLimit: Int64?
    var connections: Int?
    var finalPath: String?
    var bytesDone: Int64
    var totalBytes: Int64?
    var failureCategory: String?
    var failureReason: String?
    var addedAt: Double
    var finishedAt: Double?
    /// ``RequestOptions`` as JSON (nil when there are none).
    var request: String?
    /// Mirrors and piece hashes as JSON (``Sources``; nil when there are none).
    var sources: String?

    struct Sources: Codable {
        var mirrors: [String]
        var pieces: Metalink.Pieces?
        /// A Metalink file's length (absent in rows written before it was kept).
        var length: Int64?
    }

    mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }

    /// The destination as stored: its path relative to a base when one holds it (``PathBases``).
    static func destinationColumns(_ d: Destination, bases: PathBases = .none) -> (String, String) {
        switch d {
        case .file(let p): ("file", Self.stored(p, bases))
        case .directory(let p): ("directory", Self.stored(p, bases))
        }
    }

    /// A path as stored: `@NAME/rest` inside a base, else as it is (one already in that form, whose
    /// base is not given now, stays so: never turned into a path under the current directory).
    static func stored(_ p: FilePath, _ bases: PathBases) -> String {
        p.string.hasPrefix("@") || bases.bases.isEmpty ? p.string : bases.portable(p)
    }

    init(info: DownloadInfo, place: Int64, bases: PathBases = .none) {
        id = info.id.rawValue > 0 ? info.id.rawValue : nil
        url = info.url
        (destinationKind, destinationPath) = Self.destinationColumns(info.destination, bases: bases)
        priority = info.priority
        self.place = place
        state = info.state.rawValue
        checksum = info.checksum.map { "\($0.algorithm.rawValue)=\($0.hex)" }
        overwrite = info.overwrite
        speedLimit = info.speedLimit
        connections = info.connections
        finalPath = info.path.map { Self.stored($0, bases) }
        bytesDone = info.progress.bytesDone
        totalBytes = info.progress.totalBytes
        failureCategory = info.failure?.category.rawValue
        failureReason = info.failure?.reason
        addedAt = info.addedAt.timeIntervalSince1970
        finishedAt = info.finishedAt?.timeIntervalSince1970
        request = info.options.isEmpty ? nil : (try? JSONEncoder().encode(info.options)).map { String(decoding: $0, as: UTF8.self) }
        sources = info.mirrors.isEmpty && info.pieces == nil && info.length == nil ? nil
            : (try? JSONEncoder().encode(Sources(mirrors: info.mirrors, pieces: info.pieces, length: info.length))).map { String(decoding: $0, as: UTF8.self) }
    }

    var info: DownloadInfo { info(bases: .none) }

    /// The row as a download, its paths resolved against this launch's bases (a path whose base
    /// is not given stays in `@NAME` form: ``FileDownload`` refuses to run it).
    func info(bases: PathBases) -> DownloadInfo {
        let path = bases.resolve(destinationPath) ?? FilePath(destinationPath)
        let more = sources.flatMap { try? JSONDecoder().decode(Sources.self, from: Data($0.utf8)) }
        let failure = failureCategory.flatMap(PickupError.Category.init(rawValue:)).map {
            DownloadFailure(category: $0, reason: failureReason ?? "")
        }
        return DownloadInfo(
            id: DownloadID(rawValue: id ?? 0), url: url,
            destination: destinationKind == "file" ? .file(path) : .directory(path),
            state: DownloadState(rawValue: state) ?? .waiting, priority: priority,
            progress: DownloadProgress(bytesDone: bytesDone, totalBytes: totalBytes, bytesPerSecond: 0),
            path: finalPath.map { bases.resolve($0) ?? FilePath($0) }, failure: failure, speedLimit: speedLimit,
            checksum: checksum.flatMap(ExpectedDigest.init(checksumArgument:)), overwrite: overwrite,
            connections: connections,
            addedAt: Date(timeIntervalSince1970: addedAt), finishedAt: finishedAt.map(Date.init(timeIntervalSince1970:)),
            options: request.flatMap { try? JSONDecoder().decode(RequestOptions.self, from: Data($0.utf8)) } ?? RequestOptions(),
            mirrors: more?.mirrors ?? [], pieces: more?.pieces, length: more?.length)
    }
}

/// The manager's SQLite database (`manager.sqlite` in the state directory), through GRDB.
///
/// WAL mode with `synchronous=NORMAL`: every commit is atomic and survives the process being
/// killed at any point (a power cut may lose the last commits, never corrupt the file). The
/// connection holds the file in exclusive locking mode (the manager's lock already keeps other
/// processes out), so a commit takes no file locks and no shared-memory index is made.
/// Migrations are named and append-only: never edit one that has shipped, add the next.
///
/// State changes (``update(_:)``) are written on the blocking-I/O pool, not on the manager's actor
/// (a commit writes to the WAL; every 1000 pages SQLite checkpoints it with fsyncs): each row's
/// latest version waits in `pending` until the next write, which saves all of them in one
/// transaction. ``close()`` writes what is pending. Inserts, deletes and reads stay synchronous:
/// they are rare, and their callers need their results.
///
/// Suspended (``suspend()``: an app in the background), the connection is closed, so that no
/// file lock is held (iOS ends a suspended app that holds one in a shared container); a read or
/// write meanwhile opens the database for that call alone.
final class ManagerStore: @unchecked Sendable {
    let path: String
    private let dbLock = NIOLock()
    // Guarded by `dbLock`: the open connection (nil while suspended, or once closed), and whether
    // the store is closed for good (then nothing opens it again).
    private var db: DatabaseQueue?
    private var closed = false
    private let pendingLock = NIOLock()
    /// Held across a whole flush (taking the pending rows and writing them): flushes write in the
    /// order they took their rows. Without it a flush that took a row, then waited for the
    /// database, could write it after a later flush wrote a newer one (a pause saved, then
    /// overwritten by the row from before it: restored as waiting). Blocking-I/O threads only.
    private let flushing = NIOLock()
    // Guarded by `pendingLock`.
    private var pending: [Int64: DownloadRow] = [:]
    private var flushQueued = false

    init(directory: FilePath) throws {
        path = directory.appending("manager.sqlite").string
        db = try Self.open(path)
    }

    static func open(_ path: String) throws -> DatabaseQueue {
        var config = Configuration()
        config.label = "pickup.manager"
        config.prepareDatabase { db in
            // Before WAL is entered, so that SQLite never creates the -shm file.
            try db.execute(sql: "PRAGMA locking_mode = EXCLUSIVE")
            try db.execute(sql: "PRAGMA journal_mode = WAL")
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
        }
        let db = try DatabaseQueue(path: path, configuration: config)
        // It may hold request headers and cookies: the owner's alone.
        for file in [path, path + "-wal", path + "-journal"] { _ = chmod(file, 0o600) }
        try Self.migrator.migrate(db)
        return db
    }

    /// Runs `body` on the connection; while suspended, on one opened for this call and closed after.
    private func withDatabase<T>(_ body: (DatabaseQueue) throws -> T) throws -> T {
        try dbLock.withLock {
            if let db { return try body(db) }
            guard !closed else { throw DatabaseError(resultCode: .SQLITE_MISUSE, message: "the manager's store is closed") }
            let once = try Self.open(path)
            defer { try? once.close() }
            return try body(once)
        }
    }

    /// Writes what is pending and closes the connection, releasing its locks, until ``resume()``.
    /// Blocking: on the blocking-I/O pool.
    func suspend() {
        try? flush()
        dbLock.withLock {
            try? db?.close()
            db = nil
        }
    }

    /// Opens the connection again after ``suspend()``. Blocking: on the blocking-I/O pool.
    func resume() throws {
        try dbLock.withLock {
            guard db == nil, !closed else { return }
            db = try Self.open(path)
        }
    }

    static var migrator: DatabaseMigrator {
        var m = DatabaseMigrator()
        m.registerMigration("v1: downloads") { db in
            try db.create(table: "download") { t in
                t.autoIncrementedPrimaryKey("id")
                t.column("url", .text).notNull()
                t.column("destinationKind", .text).notNull()
                t.column("destinationPath", .text).notNull()
                t.column("priority", .integer).notNull().defaults(to: 0)
                t.column("place", .integer).notNull()
                t.column("state", .text).notNull()
                t.column("checksum", .text)
                t.column("overwrite", .boolean).notNull().defaults(to: false)
                t.column("speedLimit", .integer)
                t.column("finalPath", .text)
                t.column("bytesDone", .integer).notNull().defaults(to: 0)
                t.column("totalBytes", .integer)
                t.column("failureCategory", .text)
                t.column("failureReason", .text)
                t.column("addedAt", .double).notNull()
                t.column("finishedAt", .double)
                t.uniqueKey(["url", "destinationKind", "destinationPath"])
            }
            try db.create(index: "download_on_url", on: "download", columns: ["url"])
        }
        m.registerMigration("v2: per-download connections") { db in
            try db.alter(table: "download") { t in t.add(column: "connections", .integer) }
        }
        m.registerMigration("v3: request headers and cookies") { db in
            try db.alter(table: "download") { t in t.add(column: "request", .text) }
        }
        m.registerMigration("v4: mirrors and piece hashes") { db in
            try db.alter(table: "download") { t in t.add(column: "sources", .text) }
        }
        return m
    }

    func all() throws -> [DownloadRow] {
        try withDatabase { try $0.read { try DownloadRow.order(Column("id")).fetchAll($0) } }
    }

    /// Inserts new rows in one transaction; returns them with their ids.
    func insert(_ rows: [DownloadRow]) throws -> [DownloadRow] {
        try withDatabase { queue in
            try queue.write { db in
                try rows.map { row in
                    var r = row
                    try r.insert(db)
                    return r
                }
            }
        }
    }

    /// Saves rows soon, on the blocking-I/O pool (see the type's notes).
    func update(_ rows: [DownloadRow]) {
        let queue = pendingLock.withLock { () -> Bool in
            for r in rows { if let id = r.id { pending[id] = r } }
            defer { flushQueued = true }
            return !flushQueued
        }
        if queue { BlockingIO.submit { try? self.flush() } }
    }

    /// Writes the pending rows now. Rows that could not be written wait for the next write (never
    /// dropped: a pause made while another process held the database is saved later).
    func flush() throws {
        try flushing.withLock { try flushInOrder() }
    }

    private func flushInOrder() throws {
        let rows = pendingLock.withLock { () -> [DownloadRow] in
            defer {
                pending = [:]
                flushQueued = false
            }
            return pending.keys.sorted().compactMap { pending[$0] }
        }
        guard !rows.isEmpty else { return }
        do {
            try write(rows)
        } catch {
            pendingLock.withLock { for r in rows { if let id = r.id, pending[id] == nil { pending[id] = r } } }
            throw error
        }
    }

    /// Rewrites the rows' paths as given (destinations and final paths relative to bases, for rows
    /// stored before there were bases).
    func rewritePaths(_ rows: [DownloadRow]) throws {
        guard !rows.isEmpty else { return }
        try withDatabase { queue in
            try queue.write { db in
                let statement = try db.cachedStatement(sql: "UPDATE download SET destinationPath = ?, finalPath = ? WHERE id = ?")
                for r in rows { try statement.execute(arguments: [r.destinationPath, r.finalPath, r.id]) }
            }
        }
    }

    /// Saves rows (one statement, prepared once per connection).
    func write(_ rows: [DownloadRow]) throws {
        try withDatabase { queue in
            try queue.write { db in
                let statement = try db.cachedStatement(sql: """
                    UPDATE download SET priority = ?, place = ?, state = ?, checksum = ?, overwrite = ?, speedLimit = ?,
                    finalPath = ?, bytesDone = ?, totalBytes = ?, failureCategory = ?, failureReason = ?, finishedAt = ?
                    WHERE id = ?
                    """)
                for r in rows {
                    try statement.execute(arguments: [
                        r.priority, r.place, r.state, r.checksum, r.overwrite, r.speedLimit, r.finalPath, r.bytesDone,
                        r.totalBytes, r.failureCategory, r.failureReason, r.finishedAt, r.id,
                    ])
                }
            }
        }
    }

    func delete(_ ids: [DownloadID]) throws {
        pendingLock.withLock { for id in ids { pending[id.rawValue] = nil } }
        _ = try withDatabase { queue in
            try queue.write { db in
                try DownloadRow.deleteAll(db, keys: ids.map(\.rawValue))
            }
        }
    }

    /// Writes what is pending and closes the connection for good.
    func close() {
        try? flush()
        dbLock.withLock {
            try? db?.close()
            db = nil
            closed = true
        }
    }
}
