// swift-tools-version:6.1
// An app-sized package that depends on Pickup as a user's would (CI builds and runs it: .ci/run).
import PackageDescription

let package = Package(
    name: "Consumer",
    platforms: [.macOS(.v14), .iOS(.v17)],
    dependencies: [
        // A user writes .package(url: "https://github.com/OWNER/pickup.git", branch: "main");
        // the package's identity is the last part of that URL (here of the path): `pickup`.
        .package(path: "../pickup"),
    ],
    targets: [
        .executableTarget(name: "consumer", dependencies: [
            .product(name: "Pickup", package: "pickup"),
            .product(name: "PickupBackground", package: "pickup"),
        ]),
    ],
    swiftLanguageModes: [.v6]
)
