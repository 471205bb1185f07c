package testenv

import "testing"

func TestIsFuzzWorker(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"x.test", "-test.fuzzworker", "-test.run=^$"}, true},
		{[]string{"x.test", "-test.fuzzworker=true"}, true},
		{[]string{"x.test", "-test.fuzz=FuzzX", "-test.fuzzcachedir=/c"}, false},
		{[]string{"-test.fuzzworker"}, false}, // the program's name is not a flag
		{[]string{"x.test"}, false},
	} {
		if got := isFuzzWorker(tc.args); got != tc.want {
			t.Errorf("isFuzzWorker(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}
