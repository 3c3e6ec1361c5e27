# Write a binary file as a C array: cmake -DIN=file -DOUT=file.c -DSYMBOL=name -P embed.cmake
# Defines `const unsigned char SYMBOL[]` (8-byte aligned, as a fatbin needs)
# and `const unsigned long SYMBOL_size`.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
file(WRITE "${OUT}" "/* generated from ${IN} by embed.cmake; do not edit */\n"
  "const unsigned char ${SYMBOL}[] __attribute__((aligned(8))) = {\n${body}\n};\n"
  "const unsigned long ${SYMBOL}_size = ${bytes};\n")
