import ArgumentParser
import Foundation
import Pickup
import SystemPackage

/// Default options for `pickup get` from `$XDG_CONFIG_HOME/pickup/pickup.conf` (else
/// `~/.config/pickup/pickup.conf`), as aria2.conf, .wgetrc and .curlrc give theirs: one long option
/// a line (`connections = 4`, `limit-rate=2M`, `quiet`, with or without the leading `--`), `#`
/// comments. They go before the command line's arguments, so the command line wins (a list option,
/// `--header`, gets both). The file is refused if another user owns it or others may write it.
enum ConfigFile {
    /// The file's path from the environment, or nil when no home is known.
    static func path(environment: [String: String]) -> String? {
        if let xdg = environment["XDG_CONFIG_HOME"], xdg.hasPrefix("/") { return xdg + "/pickup/pickup.conf" }
        guard let home = environment["HOME"], home.hasPrefix("/") else { return nil }
        return home + "/.config/pickup/pickup.conf"
    }

    /// Options that only make sense for one run, or that could lose what was downloaded if they
    /// applied to every run: given on the command line only.
    static let refused: [String: String] = [
        "output": "names one file", "input-file": "names one list", "metalink": "names one file",
        "restart": "would discard every partial download", "overwrite": "would replace existing files",
        "no-config": "is for the command line",
    ]

    /// Why a config file cannot be used: one line.
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    /// The arguments the file at `path` gives (none when there is no file).
    /// - Throws: ``Failure`` saying which line is wrong, or why the file is refused.
    static func arguments(at path: String) throws(Failure) -> [String] {
        // Opened without following a final symlink? A dotfiles manager links it: follow, then check the file itself.
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        if fd < 0 {
            if errno == ENOENT || errno == ENOTDIR { return [] }
            throw Failure(description: "cannot read the config file \(path): \(Errno(rawValue: errno))")
        }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else {
            throw Failure(description: "the config file \(path) is not a regular file")
        }
        if st.st_uid != getuid() {
            throw Failure(description: "the config file \(path) belongs to another user: ignored for safety; remove it or chown it")
        }
        if st.st_mode & 0o022 != 0 {
            throw Failure(description: "the config file \(path) may be written by others (mode \(String(st.st_mode & 0o777, radix: 8))): "
                + "refused for safety; chmod go-w \(path)")
        }
        guard st.st_size <= 64 << 10 else { throw Failure(description: "the config file \(path) is over 64 KiB") }
        var bytes = [UInt8](repeating: 0, count: Int(st.st_size))
        let n = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard n >= 0 else { throw Failure(description: "cannot read the config file \(path): \(Errno(rawValue: errno))") }
        guard let text = String(bytes: bytes.prefix(n), encoding: .utf8) else {
            throw Failure(description: "the config file \(path) is not UTF-8 text")
        }
        return try arguments(of: text, in: path)
    }

    /// The arguments `text` gives, each line checked alone against `get`'s options.
    static func arguments(of text: String, in path: String) throws(Failure) -> [String] {
        var all: [String] = []
        for (i, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.trimmingCharacters(in: .whitespacesAndNewlines)
            if line.isEmpty || line.hasPrefix("#") { continue }
            let place = "\(path) line \(i + 1)"
            var name = line
            var value: String?
            if let eq = line.firstIndex(where: { $0 == "=" || $0 == " " || $0 == "\t" }) {
                name = line[..<eq].trimmingCharacters(in: .whitespaces)
                var rest = line[line.index(after: eq)...].trimmingCharacters(in: .whitespaces)
                if line[eq] != "=", rest.hasPrefix("=") { rest = rest.dropFirst().trimmingCharacters(in: .whitespaces) }
                if rest.count >= 2, let q = rest.first, q == "\"" || q == "'", rest.last == q { rest = String(rest.dropFirst().dropLast()) }
                value = rest
            }
            while name.hasPrefix("-") { name.removeFirst() }
            guard !name.isEmpty, name.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" }), name.count > 1 else {
                throw Failure(description: "\(place): expected an option's long name, as in connections = 4")
            }
            if let why = refused[name] { throw Failure(description: "\(place): --\(name) \(why): give it on the command line") }
            // `~/` at the start of a value is the home directory (as a shell would have it).
            if let v = value, v == "~" || v.hasPrefix("~/"), let home = ProcessInfo.processInfo.environment["HOME"], home.hasPrefix("/") {
                value = home + v.dropFirst()
            }
            let args = ["--" + name] + (value.map { [$0] } ?? [])
            // Each line alone, with a URL to make it a whole command, must parse and pass the checks.
            do {
                _ = try Get.parse(args + ["https://config.invalid/"])
            } catch {
                // An unknown option is what to say, not the check its value then failed (see `Validation`).
                Validation.skipped = true
                defer { Validation.skipped = false }
                let shown: any Error
                do { _ = try Get.parse(args + ["https://config.invalid/"]); shown = error } catch let parse { shown = parse }
                throw Failure(description: "\(place): \(Get.message(for: shown))")
            }
            all += args
        }
        return all
    }

    /// The command line with the config file's options put in after `get` (unless `--no-config`
    /// or `PICKUP_NO_CONFIG=1`); the same arguments for every other command.
    static func expand(_ args: [String], environment: [String: String]) throws(Failure) -> [String] {
        guard args.first == "get", !args.contains("--no-config"), environment["PICKUP_NO_CONFIG"] != "1",
            let path = path(environment: environment)
        else { return args }
        var given = try arguments(at: path)
        // The command line wins: `-o` there, and the file's `dir` (which -o excludes) is left out.
        let rest = Array(args.dropFirst())
        if rest.contains(where: { $0 == "-o" || $0 == "--output" || $0.hasPrefix("--output=") || ($0.hasPrefix("-o") && $0.count > 2) }),
            let i = given.firstIndex(of: "--dir")
        {
            given.removeSubrange(i..<min(given.count, i + 2))
        }
        return given.isEmpty ? args : ["get"] + given + rest
    }
}
