//! Symbol names as people write them.

/// A symbol's name as people write it: Rust and C++ names demangled (without Rust's hash).
/// Only names with a mangling prefix are tried (`_R`: Rust v0; `_Z`: C++ and legacy Rust):
/// the C++ demangler also reads a bare type, so a C function named `f` or `Pc` would come out
/// as `float` or `char*`, and trying every C name cost a tenth of symbolizing python3.
pub fn demangle(name: &str) -> String {
    if !(name.starts_with("_Z") || name.starts_with("_R")) {
        return name.to_string();
    }
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return format!("{rust:#}");
    }
    cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|symbol| symbol.demangle().ok())
        .unwrap_or_else(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_and_cpp_names_are_demangled() {
        assert_eq!(demangle("_ZN3log5STATE17hfaaf2b14f31f4970E"), "log::STATE");
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("_ZN2ns7counterE"), "ns::counter");
        assert_eq!(demangle("counter_a"), "counter_a");
        // C names that read as mangled types stay as they are.
        for c_name in ["f", "i", "Pc", "PyUnicode_New"] {
            assert_eq!(demangle(c_name), c_name);
        }
    }
}
