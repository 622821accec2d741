package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// pinning is the -cpus option: the consumer (changegate, or a baseline
// role) runs on one set of CPUs, this process (mongowire and the receiver,
// which share it) on another, disjoint one. The zero value pins nothing.
type pinning struct {
	consumer, bench unix.CPUSet
	on              bool
	desc            string // for the report: what was pinned, or why not
}

// minPinCPUs is how many CPUs -cpus auto needs: two for the consumer, two
// for mongowire and the receiver. With fewer, one side would be left a
// single CPU, which measures a starved process rather than its cost.
const minPinCPUs = 4

// parseCPUs reads -cpus against the CPUs this process may run on (avail):
// "" (not pinned), "auto" (the available CPUs halved: the upper half for
// the consumer, the lower for this process; not pinned, with the reason in
// desc, when fewer than minPinCPUs are available) or "CONSUMER/BENCH", two
// disjoint CPU lists such as "2-3/0-1" or "4,5/0-3".
func parseCPUs(spec string, avail []int) (pinning, error) {
	var p pinning
	switch spec {
	case "":
		p.desc = "not pinned"
		return p, nil
	case "auto":
		if len(avail) < minPinCPUs {
			p.desc = fmt.Sprintf("not pinned: -cpus auto needs %d CPUs (2 for the consumer, 2 for mongowire and the receiver), %d available", minPinCPUs, len(avail))
			return p, nil
		}
		half := len(avail) / 2
		for _, c := range avail[:half] {
			p.bench.Set(c)
		}
		for _, c := range avail[half:] {
			p.consumer.Set(c)
		}
	default:
		cs, bs, ok := strings.Cut(spec, "/")
		if !ok {
			return p, fmt.Errorf(`-cpus %q: want "auto" or CONSUMER/BENCH CPU lists, e.g. "2-3/0-1"`, spec)
		}
		var err error
		if p.consumer, err = parseCPUList(cs, avail); err != nil {
			return p, fmt.Errorf("-cpus %q: consumer: %w", spec, err)
		}
		if p.bench, err = parseCPUList(bs, avail); err != nil {
			return p, fmt.Errorf("-cpus %q: bench: %w", spec, err)
		}
		for c := range 1024 {
			if p.consumer.IsSet(c) && p.bench.IsSet(c) {
				return p, fmt.Errorf("-cpus %q: CPU %d is in both sets", spec, c)
			}
		}
	}
	p.on = true
	p.desc = fmt.Sprintf("consumer on CPUs %s, mongowire and receiver (the bench process) on %s", cpuList(&p.consumer), cpuList(&p.bench))
	return p, nil
}

// parseCPUList parses a list such as "0-1,4" of CPUs that are all in avail.
func parseCPUList(s string, avail []int) (unix.CPUSet, error) {
	var set unix.CPUSet
	if s == "" {
		return set, fmt.Errorf("empty CPU list")
	}
	for _, r := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return set, fmt.Errorf("bad CPU %q", r)
		}
		z := a
		if isRange {
			if z, err = strconv.Atoi(hi); err != nil || z < a {
				return set, fmt.Errorf("bad CPU range %q", r)
			}
		}
		for c := a; c <= z; c++ {
			if !containsInt(avail, c) {
				return set, fmt.Errorf("CPU %d is not available to this process (available: %s)", c, intList(avail))
			}
			set.Set(c)
		}
	}
	return set, nil
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// availableCPUs returns the CPUs this process may run on.
func availableCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	return setCPUs(&set), nil
}

func setCPUs(set *unix.CPUSet) []int {
	var cs []int
	for c := range 1024 {
		if set.IsSet(c) {
			cs = append(cs, c)
		}
	}
	return cs
}

func cpuList(set *unix.CPUSet) string { return intList(setCPUs(set)) }

func intList(cs []int) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = strconv.Itoa(c)
	}
	return strings.Join(parts, ",")
}

// pinSelf moves every thread of this process to the bench set. Threads
// made later inherit the mask of the thread that makes them.
func (p *pinning) pinSelf() error {
	if !p.on {
		return nil
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &p.bench); err != nil && err != unix.ESRCH {
			return fmt.Errorf("sched_setaffinity(%d): %w", tid, err)
		}
	}
	return nil
}

// startPinned runs start (which forks a child) on a thread whose mask is
// the consumer set, so the child and every thread it makes run there. The
// thread is locked for the duration: new threads the runtime needs
// meanwhile are made by its template thread, which keeps the bench set.
func (p *pinning) startPinned(start func() error) error {
	if !p.on {
		return start()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.SchedSetaffinity(0, &p.consumer); err != nil {
		return fmt.Errorf("sched_setaffinity: %w", err)
	}
	err := start()
	if rerr := unix.SchedSetaffinity(0, &p.bench); rerr != nil && err == nil {
		err = fmt.Errorf("sched_setaffinity: %w", rerr)
	}
	return err
}

// allowedCPUs returns Cpus_allowed_list of a process (for the log).
func allowedCPUs(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == "Cpus_allowed_list" {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}
