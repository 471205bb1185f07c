package virtionet

import "testing"

func TestParsePublish(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Publish
		err  bool
	}{
		{in: "8080:80", want: Publish{"tcp", "127.0.0.1", 8080, 80}},
		{in: "0.0.0.0:8080:80/tcp", want: Publish{"tcp", "0.0.0.0", 8080, 80}},
		{in: "5353:53/udp", want: Publish{"udp", "127.0.0.1", 5353, 53}},
		{in: "[::1]:8080:80", want: Publish{"tcp", "::1", 8080, 80}},
		{in: "80", err: true},
		{in: "8080:80/sctp", err: true},
		{in: "0:80", err: true},
		{in: "8080:65536", err: true},
		{in: "host:8080:80", err: true},
		{in: "[::1]:80", err: true},
	} {
		got, err := ParsePublish(tc.in)
		if (err != nil) != tc.err || (!tc.err && got != tc.want) {
			t.Errorf("ParsePublish(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
	if s := (Publish{"udp", "::1", 1, 2}).String(); s != "[::1]:1:2/udp" {
		t.Errorf("String = %q", s)
	}
}
