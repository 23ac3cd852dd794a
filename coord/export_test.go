package coord

import "time"

// LastSeen is when the server last heard from session id (a keepalive or its creation),
// zero when it has no such session: what its expiry is measured from.
func (s *Server) LastSeen(id int64) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss, ok := s.sessions[id]; ok {
		return ss.lastSeen
	}
	return time.Time{}
}
