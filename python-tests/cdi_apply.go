// cdi_apply: what a container runtime does with a CDI device request, done by the CDI
// project's own Go library (Debian's golang-github-container-orchestrated-devices-
// container-device-interface-dev), for python-tests/test_cdi.py.
//
//	cdi_apply SPEC_DIR DEVICE < oci-spec.json > edited-oci-spec.json
//
// Every spec in SPEC_DIR is validated against the project's schema.json (package schema),
// then loaded by the registry (which checks names, versions and edits itself) and DEVICE
// ("vendor/class=name") is injected into the OCI spec read from stdin (InjectDevices, as
// containerd and CRI-O call it). Exit 1 with the library's error otherwise.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/container-orchestrated-devices/container-device-interface/pkg/cdi"
	"github.com/container-orchestrated-devices/container-device-interface/schema"
	oci "github.com/opencontainers/runtime-spec/specs-go"
)

func fail(format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "cdi: "+format+"\n", a...)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 3 {
		fail("usage: cdi_apply SPEC_DIR DEVICE < oci.json")
	}
	dir, device := os.Args[1], os.Args[2]
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(files) == 0 {
		fail("no spec in %s", dir)
	}
	for _, f := range files {
		if err := schema.ValidateFile(f); err != nil {
			fail("schema: %s: %v", f, err)
		}
	}
	reg := cdi.GetRegistry(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err := reg.Refresh(); err != nil {
		fail("registry: %v", err)
	}
	for path, errs := range reg.GetErrors() {
		for _, e := range errs {
			fail("registry: %s: %v", path, e)
		}
	}
	spec := &oci.Spec{}
	if err := json.NewDecoder(os.Stdin).Decode(spec); err != nil {
		fail("oci spec: %v", err)
	}
	if unresolved, err := reg.InjectDevices(spec, device); err != nil {
		fail("inject %v: %v", unresolved, err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(spec); err != nil {
		fail("write: %v", err)
	}
}
