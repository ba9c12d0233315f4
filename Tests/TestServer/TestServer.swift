public enum TS {}
