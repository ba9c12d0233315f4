// `FilePath` is in Pickup's API (destinations, results): an app that imports Pickup has it too.
@_exported import SystemPackage
