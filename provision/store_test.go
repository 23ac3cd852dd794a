package provision

import (
	"strings"
	"testing"
)

func TestCheckStore(t *testing.T) {
	for _, tc := range []struct {
		url, wantErr string // "": accepted
	}{
		{"zk://zk1:2181,zk2:2181/prod", ""},
		{"zk://zk1:2181", "must be zk://HOST:PORT/CHROOT"},
		{"mem://x", "must be zk://HOST:PORT/CHROOT"},
		{"zks://zk1:2281/prod", "do not speak TLS to ZooKeeper yet"},
	} {
		err := CheckStore(tc.url)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("CheckStore(%q) = %v; want %q", tc.url, err, tc.wantErr)
		}
	}
}
