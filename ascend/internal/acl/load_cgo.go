//go:build ascend && cgo

package acl

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"
)

// Built reports whether this build has the cgo shim.
const Built = true

// Lib is the loaded driver. A process loads CANN once; every Load after
// the first that succeeded returns the same Lib.
type Lib struct {
	// Paths are the files the libraries were loaded from, in load order.
	Paths   []string
	handles []unsafe.Pointer // every library, in load order
	// hcclErr says why libhccl is not usable (nil: it is); single-device
	// use does not need it.
	hcclErr error
	ops     []unsafe.Pointer // the operator libraries, custom first
	// inited is set once aclInit has run.
	initOnce sync.Once
	initErr  error
}

var (
	loadMu sync.Mutex
	loaded *Lib
)

// Load opens CANN's libraries and resolves every runtime symbol the shim
// calls. Its error names the library or symbol that is missing, the
// directories tried and what to do, and wraps ErrLibrary.
func Load(o Options) (*Lib, error) {
	loadMu.Lock()
	defer loadMu.Unlock()
	if loaded != nil {
		return loaded, nil
	}
	l, err := load(o)
	if err != nil {
		// Close what was opened: a library left loaded with RTLD_GLOBAL
		// would resolve the symbols of the next attempt.
		for _, h := range l.handles {
			C.k3_dlclose(h)
		}
		return nil, err
	}
	loaded = l
	return l, nil
}

func load(o Options) (*Lib, error) {
	l := &Lib{}
	for _, name := range runtimeLibs {
		h, path, err := open(name, o.LibDirs, true)
		if err != nil {
			return l, err
		}
		l.handles = append(l.handles, h)
		l.Paths = append(l.Paths, path)
	}
	var tried []string
	for _, name := range operatorLibs {
		h, path, err := open(name, o.LibDirs, false)
		if err != nil {
			tried = append(tried, name)
			continue
		}
		l.ops = append(l.ops, h)
		l.handles = append(l.handles, h)
		l.Paths = append(l.Paths, path)
	}
	if len(l.ops) == 0 {
		return l, fmt.Errorf("%w: no operator library found (tried %s in %s); %s",
			ErrLibrary, strings.Join(tried, ", "), dirsText(o.LibDirs), hint)
	}
	l.hcclErr = l.loadHCCL(o)
	// The shim's table is bound last: a load that fails leaves it alone.
	var missing [128]C.char
	if C.k3_bind_runtime(l.handles[0], l.handles[1], &missing[0], C.size_t(len(missing))) != 0 {
		return l, fmt.Errorf("%w: symbol %s not found in %s or %s (CANN too old, or not CANN); %s",
			ErrLibrary, C.GoString(&missing[0]), l.Paths[0], l.Paths[1], hint)
	}
	return l, nil
}

// loadHCCL opens libhccl and binds the collectives; its error is kept for
// NewComm instead of failing Load.
func (l *Lib) loadHCCL(o Options) error {
	h, path, err := open("libhccl.so", o.LibDirs, false)
	if err != nil {
		return err
	}
	var missing [128]C.char
	if C.k3_bind_hccl(h, &missing[0], C.size_t(len(missing))) != 0 {
		C.k3_dlclose(h)
		return fmt.Errorf("%w: symbol %s not found in %s; %s", ErrLibrary, C.GoString(&missing[0]), path, hint)
	}
	l.handles = append(l.handles, h)
	l.Paths = append(l.Paths, path)
	return nil
}

// open dlopens name from the first of dirs that has it, else through the
// loader's own search path.
func open(name string, dirs []string, global bool) (unsafe.Pointer, string, error) {
	g := C.int(0)
	if global {
		g = 1
	}
	var buf [512]C.char
	var msgs []string
	for _, p := range append(joinAll(dirs, name), name) {
		cp := C.CString(p)
		h := C.k3_dlopen(cp, g, &buf[0], C.size_t(len(buf)))
		C.free(unsafe.Pointer(cp))
		if h != nil {
			return h, p, nil
		}
		msgs = append(msgs, C.GoString(&buf[0]))
	}
	return nil, "", fmt.Errorf("%w: cannot load %s (searched %s and the loader path: %s); %s",
		ErrLibrary, name, dirsText(dirs), msgs[len(msgs)-1], hint)
}

func joinAll(dirs []string, name string) []string {
	var out []string
	for _, d := range dirs {
		out = append(out, filepath.Join(d, name))
	}
	return out
}

func dirsText(dirs []string) string {
	if len(dirs) == 0 {
		return "no Options.LibDirs"
	}
	return strings.Join(dirs, ":")
}

// errOf turns a filled k3_err into an *Error.
func errOf(e *C.k3_err) error {
	return &Error{
		API:  C.GoString(&e.api[0]),
		Lib:  Library(e.lib),
		Code: int(e.code),
		Msg:  C.GoString(&e.msg[0]),
	}
}

// init runs aclInit once per process.
func (l *Lib) init() error {
	l.initOnce.Do(func() {
		var e C.k3_err
		if C.k3_init(&e) != 0 {
			l.initErr = errOf(&e)
		}
	})
	return l.initErr
}

// DeviceCount is the number of NPUs ACL sees.
func (l *Lib) DeviceCount() (int, error) {
	if err := l.init(); err != nil {
		return 0, err
	}
	var n C.uint32_t
	var e C.k3_err
	if C.k3_device_count(&n, &e) != 0 {
		return 0, errOf(&e)
	}
	return int(n), nil
}

// symbol finds name in the operator libraries, custom first.
func (l *Lib) symbol(name string) unsafe.Pointer {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	for _, h := range l.ops {
		if p := C.k3_dlsym(h, cn); p != nil {
			return p
		}
	}
	return nil
}

// operator resolves an aclnn operator's two phases. versions lists the
// suffixes whose signature the shim knows ("V2", ""), highest first; the
// first version whose both phases resolve wins.
func (l *Lib) operator(name string, versions ...string) (prepare, launch unsafe.Pointer, api string, err error) {
	for _, v := range versions {
		api = name + v
		prepare, launch = l.symbol(api+"GetWorkspaceSize"), l.symbol(api)
		if prepare != nil && launch != nil {
			return prepare, launch, api, nil
		}
	}
	return nil, nil, "", &Error{API: name, Lib: ACLNN, Code: 561003,
		Msg: fmt.Sprintf("operator %s%v not found in the operator libraries (%d loaded)", name, versions, len(l.ops))}
}
