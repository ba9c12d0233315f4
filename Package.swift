// swift-tools-version:6.1
import PackageDescription
#if canImport(Glibc)
import Glibc
#endif

/// `-z pack-relative-relocs` when this machine's glibc loads RELR relocations (2.36 and later; the
/// binary then needs such a glibc, as it needs the glibc it was linked against anyway). The glibc
/// asked is the one evaluating this manifest: building for another system (`--swift-sdk`, an older
/// glibc's sysroot) turns it off with `PICKUP_PACKED_RELOCS=0`.
let packedRelocations: [String] = {
    #if canImport(Glibc)
    if Context.environment["PICKUP_PACKED_RELOCS"] == "0" { return [] }
    var text = [CChar](repeating: 0, count: 64)  // "glibc 2.36"
    guard confstr(Int32(_CS_GNU_LIBC_VERSION), &text, text.count) > 0 else { return [] }
    let version = String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self).split(separator: " ").last?.split(separator: ".").compactMap { Int($0) } ?? []
    if version.count >= 2, (version[0], version[1]) >= (2, 36) { return ["-Xlinker", "-z", "-Xlinker", "pack-relative-relocs"] }
    #endif
    return []
}()

let package = Package(
    name: "Pickup",
    // macOS 14: HummingbirdWebSocket's (the daemon's aria2 RPC over WebSocket) declared minimum;
    // the library stays iOS 16 (only the daemon depends on it).
    platforms: [.macOS(.v14), .iOS(.v16)],
    products: [
        .library(name: "Pickup", targets: ["Pickup"]),
        .library(name: "PickupBackground", targets: ["PickupBackground"]),
        .executable(name: "pickup", targets: ["pickup"]),
    ],
    dependencies: [
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        // NIOSOCKS (already built for AsyncHTTPClient): FTP's control and data connections through SOCKS5.
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.35.2"),
        .package(url: "https://github.com/apple/swift-atomics.git", from: "1.3.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-crypto.git", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-system.git", from: "1.8.1"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.10.0"),
        // Traits off: no swift-configuration, nothing of Foundation beyond what we use anyway.
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1", traits: []),
        // The daemon's aria2 JSON-RPC over WebSocket (/jsonrpc, notifications).
        .package(url: "https://github.com/hummingbird-project/hummingbird-websocket.git", from: "2.8.1"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        // X509 (already built for AsyncHTTPClient): a tunnelled IP-literal origin's certificate names.
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        // RawStructuredFieldValues (already built for NIOExtras): Repr-Digest, a structured dictionary.
        .package(url: "https://github.com/apple/swift-http-structured-headers.git", from: "1.7.0"),
        // NIOTransportServices (AsyncHTTPClient's, on Apple platforms only, as there): direct
        // requests over Network.framework.
        .package(url: "https://github.com/apple/swift-nio-transport-services.git", from: "1.28.0"),
        // Subprocess: the hooks' processes (a process group each, SIGTERM then SIGKILL), and every
        // child process of the tests. It declares no iOS: only the daemon's target and the tests'
        // TestServer, which are never built for iOS, depend on it.
        .package(url: "https://github.com/swiftlang/swift-subprocess.git", from: "1.0.2"),
    ],
    targets: [
        .target(name: "CPickupShims"),
        .target(
            name: "Pickup",
            dependencies: [
                "CPickupShims",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOSOCKS", package: "swift-nio-extras"),
                .product(name: "Atomics", package: "swift-atomics"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "RawStructuredFieldValues", package: "swift-http-structured-headers"),
                // HTTPFields: requests' and responses' header fields (names compared as HTTP does).
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOTransportServices", package: "swift-nio-transport-services",
                         condition: .when(platforms: [.macOS, .iOS, .tvOS, .watchOS, .macCatalyst, .visionOS])),
            ],
            // Apple's privacy manifest (required-reason APIs: file timestamps), in the target's bundle.
            resources: [.copy("PrivacyInfo.xcprivacy")]
        ),
        // Background transfers through URLSession (FoundationNetworking on Linux): a target of its
        // own, which the statically linked `pickup` does not depend on (FoundationNetworking's
        // static library needs a static libcurl).
        .target(
            name: "PickupBackground",
            dependencies: [
                "Pickup",
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
            ]
        ),
        .target(
            name: "PickupDaemon",
            dependencies: [
                "Pickup",
                "CPickupShims",
                .product(name: "Atomics", package: "swift-atomics"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "HummingbirdWebSocket", package: "hummingbird-websocket"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Subprocess", package: "swift-subprocess", condition: .when(platforms: [.macOS, .linux])),
            ],
            resources: [.copy("Web"), .copy("openapi.json")]
        ),
        .executableTarget(
            name: "pickup",
            dependencies: [
                "Pickup",
                "PickupDaemon",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                // SIGINT and SIGTERM as an async sequence (already built for the daemon's ServiceGroup).
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ],
            // The Swift runtime and Foundation linked in, as `--static-swift-stdlib` does: a start-up
            // without loading and relocating a dozen shared libraries (10 -> 6 ms for `--version`),
            // which is a fifth of a 400-file batch; and a binary that runs where Swift is not installed.
            exclude: ["link-order.txt"],
            swiftSettings: [.unsafeFlags(["-static-stdlib"], .when(platforms: [.linux]))],
            linkerSettings: [
                // No dynamic symbol table of our own: `-static-stdlib` links with `-export-dynamic`,
                // which put 53,000 symbols (NIO's, GRDB's, ours) in .dynsym/.dynstr/.gnu.hash: 3 MiB
                // resident in every process. And relative relocations packed (RELR) where the glibc
                // building it runs them (2.36+): 150,000 of them took 3.5 MiB, all read at every start.
                .unsafeFlags(["-static-stdlib", "-use-ld=lld", "-Xlinker", "--no-export-dynamic"] + packedRelocations,
                             .when(platforms: [.linux])),
                // The objects whose code a download runs, placed first and together (generated by
                // Benchmarks/link_order.py): the kernel maps code 64 KiB at a time, and spread over
                // the whole 35 MiB they kept 20 MiB of it resident; together, 13.6 MiB.
                .unsafeFlags(["-Xlinker", "--symbol-ordering-file=\(Context.packageDirectory)/Sources/pickup/link-order.txt",
                              "-Xlinker", "--no-warn-symbol-ordering"],
                             .when(platforms: [.linux], configuration: .release)),
            ]
        ),
        .executableTarget(
            name: "pickup-queue-bench",
            dependencies: ["Pickup"],
            path: "Benchmarks/QueueBench"
        ),
        // The hand-off crash test's app (a process it kills): not a product.
        .executableTarget(
            name: "pickup-handoff-probe",
            dependencies: [
                "Pickup", "PickupBackground",
                .product(name: "SystemPackage", package: "swift-system"),
            ],
            path: "Tests/HandOffProbe"
        ),
        .target(
            name: "TestServer",
            dependencies: [
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "SystemPackage", package: "swift-system"),
                // Every child process of the tests (``Child``); declares no iOS, as for the daemon.
                .product(name: "Subprocess", package: "swift-subprocess", condition: .when(platforms: [.macOS, .linux])),
            ],
            path: "Tests/TestServer"
        ),
        .testTarget(
            name: "PickupTests",
            dependencies: [
                "Pickup", "PickupDaemon", "PickupBackground", "TestServer",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOSOCKS", package: "swift-nio-extras"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
