//! The vDSO (`[vdso]`): code the kernel maps into every process with no file behind it, so no
//! ELF symbolizer can read it by path. Every process of one kernel maps the same image, so the
//! profiler's own copy names the functions sampled in any process's `[vdso]`, as perf does.

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

/// The kernel's label of the vDSO mapping.
pub const VDSO: &str = "[vdso]";

/// This process's vDSO image, where the kernel mapped it (the same image every process of this
/// kernel maps); `None` without one.
pub fn own_image() -> Option<&'static [u8]> {
    // SAFETY: getauxval only reads this process's auxiliary vector.
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    if base == 0 {
        return None;
    }
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let (start, end) = maps.lines().find_map(|line| {
        let range = line.strip_suffix("[vdso]")?.split_whitespace().next()?;
        let (start, end) = range.split_once('-')?;
        Some((
            u64::from_str_radix(start, 16).ok()?,
            u64::from_str_radix(end, 16).ok()?,
        ))
    })?;
    if start != base as u64 || end <= start {
        return None;
    }
    // SAFETY: [start, end) is this process's vDSO mapping, readable and never unmapped or
    // written while the process lives; the slice is only read.
    Some(unsafe { std::slice::from_raw_parts(start as *const u8, (end - start) as usize) })
}

/// The functions of the vDSO image, by offset in the image.
#[derive(Debug, Default)]
pub struct Vdso {
    /// (offset, size, name), sorted by offset.
    functions: Vec<(u64, u64, String)>,
}

impl Vdso {
    /// This process's vDSO, read where the kernel mapped it; `None` without one.
    pub fn own() -> Option<Vdso> {
        Vdso::parse(own_image()?)
    }

    /// The functions of a vDSO image (an ELF shared object).
    pub fn parse(image: &[u8]) -> Option<Vdso> {
        let file = object::File::parse(image).ok()?;
        // The image is mapped whole from its start: an address's offset in the mapping is its
        // file offset, which the loadable segment relates to symbol addresses.
        let segment = file.segments().next()?;
        let (segment_offset, _) = segment.file_range();
        let to_offset =
            |address: u64| Some(address.checked_sub(segment.address())? + segment_offset);
        let mut functions: Vec<(u64, u64, String)> = file
            .dynamic_symbols()
            .filter(|symbol| symbol.kind() == SymbolKind::Text && symbol.size() > 0)
            .filter_map(|symbol| {
                let name = symbol.name().ok()?.to_string();
                Some((to_offset(symbol.address())?, symbol.size(), name))
            })
            .collect();
        // Several names for one function (`clock_gettime`, `__vdso_clock_gettime`): the
        // kernel's own `__vdso_` name first, as perf shows it.
        functions.sort_by_key(|(offset, _, name)| (*offset, !name.starts_with("__vdso_")));
        functions.dedup_by_key(|(offset, _, _)| *offset);
        Some(Vdso { functions })
    }

    /// The function at `offset` in the image: its name and start offset.
    pub fn lookup(&self, offset: u64) -> Option<(&str, u64)> {
        let index = self
            .functions
            .partition_point(|(start, _, _)| *start <= offset);
        let (start, size, name) = self.functions.get(index.checked_sub(1)?)?;
        (offset < start + size).then_some((name.as_str(), *start))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernels_vdso_names_clock_gettime() {
        let vdso = Vdso::own().expect("Linux maps a vDSO into every process");
        let (_, _, name) = vdso
            .functions
            .iter()
            .find(|(_, _, name)| name.ends_with("clock_gettime"))
            .expect("the vDSO exports clock_gettime");
        assert_eq!(
            name, "__vdso_clock_gettime",
            "the __vdso_ name is preferred"
        );
        let (offset, size, _) = vdso.functions[0];
        assert_eq!(
            vdso.lookup(offset),
            Some((vdso.functions[0].2.as_str(), offset))
        );
        assert_eq!(
            vdso.lookup(offset + size - 1).map(|(_, start)| start),
            Some(offset)
        );
        assert!(vdso.lookup(0).is_none(), "the ELF header is no function");
    }
}
