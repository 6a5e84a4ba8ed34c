//! Where each GPU sits: its PCI bus id, UUID, NUMA node and the CPUs local to it.
//!
//! Read from the files NVIDIA's kernel module and Linux publish, all under a sysroot prefix
//! so tests can point at the tree `fakecuda-smi --sysroot DIR` writes:
//!   - `<root>/proc/driver/nvidia/gpus/<bus>/information`: `Key: value` lines, of which we
//!     use `GPU UUID`, `Bus Location`, `Device Minor` and `Model` (format as written by the
//!     open-gpu-kernel-modules `nv-procfs.c`, `nv_procfs_read_gpu_info`);
//!   - `<root>/sys/bus/pci/devices/<bus>/numa_node` (`-1` = unknown) and `local_cpulist`;
//!   - `<root>/sys/devices/system/node/node<N>/cpulist`.
//!
//! Pure and safe. Nothing here is required: a node without these files simply has an unknown
//! topology, and the planner falls back to plain CPU blocks and says so.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::cpuset::CpuSet;

/// One GPU as the kernel module describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    /// Canonical bus id (`0000:18:00.0`, see [`normalize_bus_id`]).
    pub bus_id: String,
    pub uuid: Option<String>,
    pub model: Option<String>,
    pub minor: Option<u32>,
    /// None when sysfs says `-1` or has no file.
    pub numa_node: Option<u32>,
    /// sysfs `local_cpulist` of the PCI device, when readable.
    pub local_cpulist: Option<CpuSet>,
}

/// The node's GPUs (ordered by bus id) and NUMA nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    pub gpus: Vec<GpuInfo>,
    /// NUMA node -> its CPUs (`node<N>/cpulist`).
    pub nodes: BTreeMap<u32, CpuSet>,
}

/// A topology file that exists but cannot be read or understood.
#[derive(Debug)]
pub struct TopologyError {
    pub path: PathBuf,
    pub reason: String,
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)
    }
}

impl std::error::Error for TopologyError {}

/// Canonical PCI bus id: 4-hex-digit domain, lower case (`0000:3b:00.0`), the spelling of
/// sysfs and of the procfs directory names. Accepts NVML's 8-digit domain
/// (`00000000:3B:00.0`) and the driver's `cuDeviceGetPCIBusId` form (`0000:3B:00.0`).
pub fn normalize_bus_id(text: &str) -> Option<String> {
    let t = text.trim();
    let (domain, rest) = t.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    let hex = |s: &str, max: u32| -> Option<u32> {
        if s.is_empty() || s.len() > 8 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(s, 16).ok().filter(|v| *v <= max)
    };
    let (d, b, v, f) = (
        hex(domain, 0xffff)?,
        hex(bus, 0xff)?,
        hex(dev, 0x1f)?,
        hex(func, 7)?,
    );
    Some(format!("{d:04x}:{b:02x}:{v:02x}.{f:x}"))
}

impl Topology {
    /// Read the topology under `sysroot` (`/` on a real node). Missing directories give an
    /// empty topology; a file that exists but does not parse is an error naming it.
    pub fn read(sysroot: &Path) -> Result<Topology, TopologyError> {
        let mut topo = Topology::default();
        let gpus_dir = sysroot.join("proc/driver/nvidia/gpus");
        for dir in list_dir(&gpus_dir)? {
            let info_path = dir.join("information");
            let Some(text) = read_optional(&info_path)? else {
                continue;
            };
            let mut gpu = parse_information(&text).map_err(|reason| TopologyError {
                path: info_path.clone(),
                reason,
            })?;
            if gpu.bus_id.is_empty() {
                // Older drivers omit `Bus Location`; the directory is named by it.
                let name = dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                gpu.bus_id = normalize_bus_id(&name).ok_or_else(|| TopologyError {
                    path: info_path.clone(),
                    reason: format!(
                        "no 'Bus Location' line and directory name '{name}' is not a PCI bus id"
                    ),
                })?;
            }
            let pci = sysroot.join("sys/bus/pci/devices").join(&gpu.bus_id);
            let numa_path = pci.join("numa_node");
            if let Some(t) = read_optional(&numa_path)? {
                let v: i64 = t.trim().parse().map_err(|_| TopologyError {
                    path: numa_path.clone(),
                    reason: format!("'{}' is not a NUMA node number", t.trim()),
                })?;
                gpu.numa_node = u32::try_from(v).ok();
            }
            let cpus_path = pci.join("local_cpulist");
            if let Some(t) = read_optional(&cpus_path)? {
                gpu.local_cpulist = Some(CpuSet::parse(&t).map_err(|e| TopologyError {
                    path: cpus_path.clone(),
                    reason: e.to_string(),
                })?);
            }
            topo.gpus.push(gpu);
        }
        topo.gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));

        let nodes_dir = sysroot.join("sys/devices/system/node");
        for dir in list_dir(&nodes_dir)? {
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let Some(num) = name
                .strip_prefix("node")
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let path = dir.join("cpulist");
            if let Some(t) = read_optional(&path)? {
                let set = CpuSet::parse(&t).map_err(|e| TopologyError {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                topo.nodes.insert(num, set);
            }
        }
        Ok(topo)
    }

    pub fn by_bus_id(&self, bus_id: &str) -> Option<&GpuInfo> {
        let want = normalize_bus_id(bus_id)?;
        self.gpus.iter().find(|g| g.bus_id == want)
    }

    /// Exact UUID match, ASCII case-insensitive (`GPU-`/`MIG-` prefix included).
    pub fn by_uuid(&self, uuid: &str) -> Option<&GpuInfo> {
        self.gpus.iter().find(|g| {
            g.uuid
                .as_deref()
                .is_some_and(|u| u.eq_ignore_ascii_case(uuid))
        })
    }

    /// The CPUs local to a GPU: its NUMA node's `cpulist` when the node is known, else the
    /// device's own `local_cpulist`. None when neither is published.
    pub fn local_cpus(&self, gpu: &GpuInfo) -> Option<CpuSet> {
        if let Some(set) = gpu.numa_node.and_then(|n| self.nodes.get(&n)) {
            return Some(set.clone());
        }
        gpu.local_cpulist.clone()
    }
}

/// Parse one `information` file. Unknown keys are ignored (drivers add lines over time).
fn parse_information(text: &str) -> Result<GpuInfo, String> {
    let mut gpu = GpuInfo {
        bus_id: String::new(),
        uuid: None,
        model: None,
        minor: None,
        numa_node: None,
        local_cpulist: None,
    };
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "GPU UUID" => gpu.uuid = Some(value.to_string()),
            "Model" => gpu.model = Some(value.to_string()),
            "Bus Location" => {
                gpu.bus_id = normalize_bus_id(value)
                    .ok_or_else(|| format!("'Bus Location: {value}' is not a PCI bus id"))?;
            }
            "Device Minor" => {
                gpu.minor = Some(
                    value
                        .parse()
                        .map_err(|_| format!("'Device Minor: {value}' is not a number"))?,
                );
            }
            _ => {}
        }
    }
    Ok(gpu)
}

fn list_dir(dir: &Path) -> Result<Vec<PathBuf>, TopologyError> {
    match fs::read_dir(dir) {
        Ok(rd) => {
            let mut out: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
            out.sort();
            Ok(out)
        }
        Err(e)
            if e.kind() == io::ErrorKind::NotFound || e.kind() == io::ErrorKind::NotADirectory =>
        {
            Ok(vec![])
        }
        Err(e) => Err(TopologyError {
            path: dir.to_path_buf(),
            reason: e.to_string(),
        }),
    }
}

fn read_optional(path: &Path) -> Result<Option<String>, TopologyError> {
    match fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TopologyError {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch sysroot, removed on drop.
    struct Root(PathBuf);

    impl Root {
        fn new(tag: &str) -> Root {
            let p =
                std::env::temp_dir().join(format!("rankguard-topo-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            Root(p)
        }
        fn write(&self, rel: &str, text: &str) {
            let p = self.0.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        fn gpu(&self, bus: &str, uuid: &str, minor: u32, numa: i32, cpus: &str) {
            self.write(&format!("proc/driver/nvidia/gpus/{bus}/information"), &format!(
                "Model: \t\t NVIDIA Fake\nIRQ:   \t\t 42\nGPU UUID: \t {uuid}\nVideo BIOS: \t ??.??.??.??.??\n\
                 Bus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\n\
                 Bus Location: \t {bus}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"));
            self.write(
                &format!("sys/bus/pci/devices/{bus}/numa_node"),
                &format!("{numa}\n"),
            );
            self.write(
                &format!("sys/bus/pci/devices/{bus}/local_cpulist"),
                &format!("{cpus}\n"),
            );
        }
    }

    impl Drop for Root {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn bus_ids_are_normalized() {
        assert_eq!(
            normalize_bus_id("0000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(
            normalize_bus_id("00000000:18:00.0").as_deref(),
            Some("0000:18:00.0")
        );
        assert_eq!(
            normalize_bus_id(" 0001:af:1f.7\n").as_deref(),
            Some("0001:af:1f.7")
        );
        for bad in [
            "",
            "18:00.0",
            "0000:18:00",
            "0000:18:20.0",
            "0000:x8:00.0",
            "0000:18:00.8",
        ] {
            assert_eq!(normalize_bus_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn reads_a_two_node_machine() {
        let r = Root::new("two");
        r.gpu(
            "0000:28:00.0",
            "GPU-11c0ffee-0000-4000-8000-000000000001",
            1,
            0,
            "0-7",
        );
        r.gpu(
            "0000:18:00.0",
            "GPU-10c0ffee-0000-4000-8000-000000000000",
            0,
            0,
            "0-7",
        );
        r.gpu(
            "0000:38:00.0",
            "GPU-12c0ffee-0000-4000-8000-000000000002",
            2,
            1,
            "8-15",
        );
        r.write("sys/devices/system/node/node0/cpulist", "0-7\n");
        r.write("sys/devices/system/node/node1/cpulist", "8-15\n");
        r.write("sys/devices/system/node/possible", "0-1\n");
        let t = Topology::read(&r.0).unwrap();
        assert_eq!(t.gpus.len(), 3);
        assert_eq!(t.gpus[0].bus_id, "0000:18:00.0");
        assert_eq!(t.gpus[0].minor, Some(0));
        assert_eq!(t.gpus[0].model.as_deref(), Some("NVIDIA Fake"));
        assert_eq!(t.nodes.len(), 2);
        let g = t.by_bus_id("0000:38:00.0").unwrap();
        assert_eq!(g.numa_node, Some(1));
        assert_eq!(t.local_cpus(g).unwrap().to_string(), "8-15");
        let g = t
            .by_uuid("gpu-11C0FFEE-0000-4000-8000-000000000001")
            .unwrap();
        assert_eq!(g.bus_id, "0000:28:00.0");
        assert!(t.by_bus_id("0000:99:00.0").is_none());
    }

    #[test]
    fn unknown_numa_node_uses_local_cpulist() {
        let r = Root::new("nonuma");
        r.gpu("0000:18:00.0", "GPU-a", 0, -1, "0-3");
        let t = Topology::read(&r.0).unwrap();
        assert_eq!(t.gpus[0].numa_node, None);
        assert_eq!(t.local_cpus(&t.gpus[0]).unwrap().to_string(), "0-3");
    }

    #[test]
    fn missing_tree_is_an_empty_topology() {
        let r = Root::new("empty");
        let t = Topology::read(&r.0).unwrap();
        assert!(t.gpus.is_empty() && t.nodes.is_empty());
        let t = Topology::read(&r.0.join("does-not-exist")).unwrap();
        assert!(t.gpus.is_empty());
    }

    #[test]
    fn malformed_files_name_the_file() {
        let r = Root::new("bad");
        r.gpu("0000:18:00.0", "GPU-a", 0, 0, "0-3");
        r.write("sys/bus/pci/devices/0000:18:00.0/numa_node", "zero\n");
        let e = Topology::read(&r.0).unwrap_err();
        assert!(
            e.to_string().contains("numa_node") && e.to_string().contains("zero"),
            "{e}"
        );
        r.write("sys/bus/pci/devices/0000:18:00.0/numa_node", "0\n");
        r.write("sys/bus/pci/devices/0000:18:00.0/local_cpulist", "0-x\n");
        let e = Topology::read(&r.0).unwrap_err();
        assert!(e.to_string().contains("local_cpulist"), "{e}");
    }

    #[test]
    fn directory_name_stands_in_for_a_missing_bus_location() {
        let r = Root::new("nobus");
        r.write(
            "proc/driver/nvidia/gpus/0000:3B:00.0/information",
            "Model: X\nGPU UUID: GPU-b\n",
        );
        let t = Topology::read(&r.0).unwrap();
        assert_eq!(t.gpus[0].bus_id, "0000:3b:00.0");
    }
}
