#include <cstdio>
int main() { std::puts("sparrow"); return 0; }
