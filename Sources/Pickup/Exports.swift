// Pickup does not re-export SystemPackage: on Apple platforms its `FilePath` is another type than
// `System.FilePath`, and an app importing both would find the name ambiguous. The API takes and
// gives `URL` too (Core/URLConveniences.swift); code that names `FilePath` imports SystemPackage.
