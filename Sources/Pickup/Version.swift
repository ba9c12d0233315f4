public enum PickupVersion { public static let string = "0.1.0" }
