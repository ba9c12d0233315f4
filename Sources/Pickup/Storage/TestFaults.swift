import Atomics
import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// File-system faults a test asks for, so that every file operation of a run can be made to fail
/// as a full disk, a quota or a failing drive would, in a real `pickup` process.
///
/// `PICKUP_TEST_FAULTS` is a comma-separated list of `OPERATION=ERROR@N`: the operation fails
/// with the error once N of it have succeeded (`write`: N bytes into partial files; the others:
/// N calls), and every time after that, as a full disk does. Operations: `write` (the body),
/// `sync` (fsync of the partial file), `store` (a control file), `cursor` (the cursor file's
/// blocks), `finish` (the rename into place), `truncate`. Errors: `ENOSPC`, `EIO`, `EDQUOT`.
/// Unset (always, outside tests), every check is one load of a constant.
enum TestFaults {
    enum Operation: String, CaseIterable {
        case write, sync, store, cursor, finish, truncate
    }

    struct Rule {
        let error: Errno
        let after: Int64
        let count = ManagedAtomic<Int64>(0)
    }

    /// Whether any fault was asked for.
    static let enabled: Bool = !rules.isEmpty

    static let rules: [String: Rule] = {
        guard let raw = getenv("PICKUP_TEST_FAULTS").map({ String(cString: $0) }) else { return [:] }
        var rules: [String: Rule] = [:]
        for item in raw.split(separator: ",") {
            let parts = item.split(separator: "=", maxSplits: 1)
            guard parts.count == 2, let op = Operation(rawValue: String(parts[0])) else { continue }
            let spec = parts[1].split(separator: "@", maxSplits: 1)
            let after = spec.count == 2 ? Int64(spec[1]) ?? 0 : 0
            let error: Errno
            switch spec[0] {
            case "EIO": error = .ioError
            case "EDQUOT": error = Errno(rawValue: EDQUOT)
            default: error = .noSpace
            }
            rules[op.rawValue] = Rule(error: error, after: after)
        }
        return rules
    }()

    /// Throws the fault asked for `operation`, if its turn has come; `amount` is what this call
    /// adds (bytes for `write`, else 1).
    @inline(__always)
    static func check(_ operation: Operation, amount: Int64 = 1) throws(Errno) {
        guard _slowPath(enabled) else { return }
        try slowCheck(operation, amount: amount)
    }

    @inline(never)
    static func slowCheck(_ operation: Operation, amount: Int64) throws(Errno) {
        guard let rule = rules[operation.rawValue] else { return }
        let before = rule.count.loadThenWrappingIncrement(by: amount, ordering: .relaxed)
        if before + amount > rule.after { throw rule.error }
    }
}
