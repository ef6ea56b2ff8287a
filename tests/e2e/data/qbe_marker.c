/* An ELF marker (a "#!" one would be read by its interpreter through the fd table the exec
 * kept): writes MARKER (a -D of the build) and prints "MARKER mark RAN". */
#include <stdio.h>
int main(void)
{
    FILE *f = fopen(MARKER, "w");
    if (f != NULL) {
        fputs("ran\n", f);
        fclose(f);
    }
    puts("MARKER mark RAN");
    return 0;
}
