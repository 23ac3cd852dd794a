package cluster

import (
	"fmt"
	"strconv"
	"strings"
)

// UIDRange is the uids tenants are given from (master and up --tenant-uids FIRST-LAST),
// both ends included. Each tenant takes two consecutive ones: its workers' and its routers'
// (Tenant.RouterUID).
type UIDRange struct {
	First int `json:"first"`
	Last  int `json:"last"`
}

// DefaultTenantUIDs is the range when the operator names none: far above the uids of a
// distribution's users (below 60000) and nobody (65534), below the 2^31 that some tools
// take for a negative number.
var DefaultTenantUIDs = UIDRange{First: 200000, Last: 299999}

// MinTenantUID is the lowest uid a range may start at: below it are root, the system's
// users and the first human users of most distributions.
const MinTenantUID = 1000

// maxTenantUID keeps uids below what 32-bit signed fields (and (uid_t)-1, "no change")
// take for special.
const maxTenantUID = 1<<31 - 2

// UIDsPerTenant is how many uids one tenant takes: its workers' and its routers'.
const UIDsPerTenant = 2

func (r UIDRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// Contains reports whether uid is in the range.
func (r UIDRange) Contains(uid int) bool { return uid >= r.First && uid <= r.Last }

// Tenants is how many tenants the range holds.
func (r UIDRange) Tenants() int { return (r.Last - r.First + 1) / UIDsPerTenant }

// Validate checks the range is one tenants may be given uids from; self is the uid of the
// process that checks (the master's, or up's, which is also its agent's), which the range
// must not hold. The error is one line saying what to do.
func (r UIDRange) Validate(self int) error {
	switch {
	case r.First < MinTenantUID:
		return fmt.Errorf("--tenant-uids %s starts below %d (root, the system's and the first human users): start it at %d or above, e.g. %s",
			r, MinTenantUID, MinTenantUID, DefaultTenantUIDs)
	case r.Last > maxTenantUID:
		return fmt.Errorf("--tenant-uids %s ends above %d: end it lower, e.g. %s", r, maxTenantUID, DefaultTenantUIDs)
	case r.Last < r.First+UIDsPerTenant-1:
		return fmt.Errorf("--tenant-uids %s holds fewer than the %d uids one tenant takes (its workers' and its routers'): give FIRST-LAST with LAST above FIRST, e.g. %s",
			r, UIDsPerTenant, DefaultTenantUIDs)
	case r.Contains(65534):
		return fmt.Errorf("--tenant-uids %s holds 65534 (nobody, which other software runs as): choose a range above or below it, e.g. %s", r, DefaultTenantUIDs)
	case self > 0 && r.Contains(self):
		return fmt.Errorf("--tenant-uids %s holds uid %d, the one this process runs as: a tenant would run as it; choose a range without it, e.g. %s", r, self, DefaultTenantUIDs)
	}
	return nil
}

// ParseUIDRange reads FIRST-LAST (both included) and validates it (see Validate).
func ParseUIDRange(s string, self int) (UIDRange, error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), "-")
	first, err1 := strconv.Atoi(a)
	last, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil {
		return UIDRange{}, fmt.Errorf("--tenant-uids %q is not FIRST-LAST: give two uids, e.g. %s", s, DefaultTenantUIDs)
	}
	r := UIDRange{First: first, Last: last}
	if err := r.Validate(self); err != nil {
		return UIDRange{}, err
	}
	return r, nil
}

// TenantUIDCounter is the value at TenantUIDsKey: the next uid to give. It only grows: a
// uid, once given, is never given again, whatever the range becomes.
type TenantUIDCounter struct {
	Next int `json:"next"`
}
